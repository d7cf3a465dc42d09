"""Approval policies: deadlines, escalation, N-of-M approvals and assignment."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone
from pydantic import BaseModel

from actions import engine
from actions.core import ActionContext, ActionInterrupt, ApprovalPolicy, action
from actions.models import ApiToken, Interrupt, Policy, Run, Team

# Runs with steps in workers and inline, on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]


class Item(BaseModel):
    name: str


def pausing(ctx: ActionContext) -> dict[str, Any]:
    if ctx.resumption is None:
        raise ActionInterrupt(f"Approve {ctx.input.name}?", {"name": ctx.input.name})
    return {"answer": ctx.resumption.data}


def register(name: str, policy: ApprovalPolicy) -> None:
    action(input=Item, name=name, policy=policy)(pausing)


register(
    "policy_auto",
    ApprovalPolicy(deadline=timedelta(hours=1), default_answer={"approved": True, "by": "default"}),
)
register("policy_expiring", ApprovalPolicy(deadline=timedelta(minutes=30)))
register("policy_four_eyes", ApprovalPolicy(approvals=2))
register("policy_escalating", ApprovalPolicy(escalate_after=timedelta(minutes=10), escalate_to="payroll"))
register("policy_assigned", ApprovalPolicy(assignees=("reviewer2",)))


def start(team: Team, name: str) -> Interrupt:
    run = engine.start_run(name, {"name": "thing"}, team, None)
    return run.interrupts.get()


def later(minutes: int) -> Any:
    return timezone.now() + timedelta(minutes=minutes)


def test_a_deadline_applies_the_default_answer_recorded_as_the_policy(team: Team) -> None:
    interrupt = start(team, "policy_auto")
    assert interrupt.expires_at is not None
    assert engine.apply_policies(now=later(30)) == 0
    assert engine.apply_policies(now=later(61)) == 1
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.decided_by_name, interrupt.decided_by, interrupt.decided_via) == (
        "approved",
        "deadline policy",
        None,
        "deadline",
    )
    run = Run.objects.get(pk=interrupt.run_id)
    assert run.status == "completed" and run.output == {"answer": {"approved": True, "by": "default"}}
    assert engine.apply_policies(now=later(120)) == 0, "exactly once"


def test_without_a_default_answer_the_interrupt_expires_and_the_run_fails_clearly(team: Team) -> None:
    interrupt = start(team, "policy_expiring")
    engine.apply_policies(now=later(31))
    interrupt.refresh_from_db()
    run = Run.objects.get(pk=interrupt.run_id)
    assert interrupt.status == "expired" and run.status == "failed"
    assert run.error.startswith("the approval expired at ") and run.error.endswith("without a decision")
    with pytest.raises(engine.AlreadyDecided, match="already expired by deadline policy"):
        engine.resume(interrupt, {"approved": True}, None)


def race_deadline_against(team: Team, reviewer: User) -> None:
    interrupt = start(team, "policy_auto")
    barrier = threading.Barrier(2)
    outcome: dict[str, Any] = {}

    def reviewer_approves() -> None:
        barrier.wait()
        try:
            engine.resume(interrupt, {"approved": True, "by": "reviewer"}, reviewer)
            outcome["reviewer"] = "won"
        except engine.AlreadyDecided:
            outcome["reviewer"] = "lost"
        finally:
            connection.close()

    def deadline_fires() -> None:
        barrier.wait()
        outcome["policy"] = engine.apply_policies(now=later(61))
        connection.close()

    threads = [threading.Thread(target=reviewer_approves), threading.Thread(target=deadline_fires)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    run = Run.objects.get(pk=interrupt.run_id)
    winner = "reviewer" if outcome["reviewer"] == "won" else "default"
    assert outcome["policy"] == (0 if winner == "reviewer" else 1)
    assert run.status == "completed" and run.output["answer"]["by"] == winner
    assert run.events.filter(kind="approved").count() == 1 and run.events.filter(kind="resumed").count() == 1


@pytest.mark.django_db(transaction=True)  # threads with their own connections
def test_a_deadline_racing_a_reviewer_gives_exactly_one_decision(team: Team, reviewer: User) -> None:
    for _ in range(5):
        race_deadline_against(team, reviewer)


def test_four_eyes_needs_two_different_people_and_any_reject_rejects(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    interrupt = start(team, "policy_four_eyes")
    client = Client()
    client.force_login(reviewer)
    client.post(f"/interrupts/{interrupt.pk}/approve/", {})
    interrupt.refresh_from_db()
    assert interrupt.status == "pending"
    inbox = client.get("/").content.decode()
    assert "1 of 2 approvals" in inbox
    again = client.post(f"/interrupts/{interrupt.pk}/approve/", {})
    assert (
        again.status_code == 403
        and "You already approved this; it needs 2 different people." in again.content.decode()
    )

    # Each approver's comment is their own: the decision they agree on is "approved".
    engine.resume(interrupt, {"approved": True, "comment": "checked the ledger"}, second_reviewer)
    run = Run.objects.get(pk=interrupt.run_id)
    assert run.status == "completed"
    assert run.output == {"answer": {"approved": True, "comment": "checked the ledger"}}
    assert list(interrupt.approvals.values_list("user__username", flat=True).order_by("at")) == [
        "reviewer1",
        "reviewer2",
    ]

    other = start(team, "policy_four_eyes")
    engine.resume(other, {"approved": True}, reviewer)
    engine.reject(other, "not convinced", second_reviewer)
    assert Run.objects.get(pk=other.run_id).status == "rejected"


def test_an_api_token_cannot_be_one_of_several_required_approvers(team: Team) -> None:
    interrupt = start(team, "policy_four_eyes")
    token = ApiToken.issue(team, "bot")[0]
    with pytest.raises(engine.NotAllowed, match="an API token is not a person"):
        engine.resume(interrupt, {"approved": True}, token)


def test_escalation_shows_the_interrupt_to_the_other_team_and_lets_it_decide(
    team: Team, other_team: Team, reviewer: User, outsider: User
) -> None:
    interrupt = start(team, "policy_escalating")
    client = Client()
    client.force_login(outsider)
    assert client.get(f"/interrupts/{interrupt.pk}/").status_code == 404
    assert engine.apply_policies(now=later(11)) == 1
    assert engine.apply_policies(now=later(12)) == 0
    inbox = client.get("/").content.decode()
    assert f"interrupt-{interrupt.pk}" in inbox and "escalated to Payroll" in inbox
    # The original team still has it too.
    mine = Client()
    mine.force_login(reviewer)
    assert f"interrupt-{interrupt.pk}" in mine.get("/").content.decode()
    client.post(f"/interrupts/{interrupt.pk}/approve/", {})
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.decided_by_name) == ("approved", "payroll1")
    kinds = list(Run.objects.get(pk=interrupt.run_id).events.values_list("kind", flat=True))
    assert kinds.index("escalated") < kinds.index("approved")


def test_an_assigned_interrupt_is_decided_only_by_its_assignees(
    team: Team, reviewer: User, second_reviewer: User, token_key: str
) -> None:
    interrupt = start(team, "policy_assigned")
    client = Client()
    client.force_login(reviewer)
    response = client.post(f"/interrupts/{interrupt.pk}/approve/", {})
    assert response.status_code == 403 and "Only reviewer2 may decide this." in response.content.decode()
    api = Client().post(
        f"/api/interrupts/{interrupt.pk}/resume", {"data": {}}, content_type="application/json",
        headers={"Authorization": f"Bearer {token_key}"},
    )  # fmt: skip
    assert api.status_code == 403 and api.json()["detail"] == "Only reviewer2 may decide this."
    engine.resume(interrupt, {"approved": True}, second_reviewer)
    assert Run.objects.get(pk=interrupt.run_id).status == "completed"


def test_a_team_policy_in_the_admin_overrides_the_actions(team: Team, second_reviewer: User) -> None:
    Policy.objects.create(team=team, action="send_invoice", approvals_required=2, deadline_minutes=5)
    run = engine.start_run("send_invoice", {"invoice_id": "P-1", "amount": 1}, team, None)
    interrupt = run.interrupts.get()
    assert interrupt.approvals_required == 2 and interrupt.expires_at is not None
    engine.apply_policies(now=later(6))
    interrupt.refresh_from_db()
    assert interrupt.status == "expired"


@pytest.mark.django_db(transaction=True)  # threads with their own connections
def test_the_embedded_periodic_loop_survives_a_dropped_database_connection(team: Team) -> None:
    """`make run`'s own loop fires deadlines; a connection that died (a restarted PostgreSQL)
    is replaced on the next round instead of failing every round until a restart."""
    from actions.management.commands.serve import run_periodic_tick

    interrupt = start(team, "policy_expiring")
    Interrupt.objects.filter(pk=interrupt.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    connection.ensure_connection()
    assert connection.connection is not None
    connection.connection.close()  # the server went away under us
    run_periodic_tick(sweep=True)
    interrupt.refresh_from_db()
    assert interrupt.status == "expired"


def test_cancelling_is_a_decision_an_assigned_approval_is_not_ended_by_another_member(
    team: Team, reviewer: User, second_reviewer: User, requester: User, token_key: str
) -> None:
    interrupt = start(team, "policy_assigned")
    run = Run.objects.get(pk=interrupt.run_id)
    with pytest.raises(engine.NotAllowed, match="Only reviewer2 may decide this"):
        engine.cancel(run, reviewer)
    token = engine.authenticate(token_key)
    assert token is not None
    with pytest.raises(engine.NotAllowed, match="may not decide"):
        engine.cancel(run, token)
    assert Run.objects.get(pk=run.pk).status == "interrupted"
    engine.cancel(run, second_reviewer)  # the assignee may
    assert Run.objects.get(pk=run.pk).status == "cancelled"

    # Whoever started a run may withdraw it, whatever it waits on.
    mine = engine.start_run("policy_assigned", {"name": "mine"}, team, requester)
    engine.cancel(mine, requester)
    assert Run.objects.get(pk=mine.pk).status == "cancelled"


def test_a_run_whose_step_is_running_is_not_cancelled_under_it(team: Team, reviewer: User) -> None:
    """Its action would go on and its result be dropped while the run said "cancelled"."""
    interrupt = start(team, "policy_auto")
    Run.objects.filter(pk=interrupt.run_id).update(status="running")
    with pytest.raises(engine.NotCancellable, match="running a step; cancel it once it pauses"):
        engine.cancel(Run.objects.get(pk=interrupt.run_id), reviewer)
    assert Interrupt.objects.get(pk=interrupt.pk).status == "pending"
