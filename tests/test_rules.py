"""Rules, standing grants and delegation (actions.engine.rules): what decides, assigns or
routes an interrupt when it is created, and what none of them may do."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from pydantic import BaseModel

from actions import engine
from actions.core import (
    ActionContext,
    ActionInterrupt,
    ApprovalPolicy,
    Approve,
    AssignTo,
    ConditionError,
    Reject,
    RequireApprovals,
    RouteTo,
    Rule,
    action,
)
from actions.engine import rules
from actions.models import Grant, Interrupt, Run, RunEvent, Team, TeamRule
from tests.conftest import member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("steps", "database")]


class Refund(BaseModel):
    customer: str
    amount: float


class Verdict(BaseModel):
    approved: bool
    note: str = ""


def refunding(ctx: ActionContext) -> dict[str, Any]:
    if ctx.resumption is None:
        raise ActionInterrupt(
            f"Refund {ctx.input.amount} to {ctx.input.customer}?",
            {"customer": ctx.input.customer, "amount": ctx.input.amount},
        )
    return {"answer": ctx.resumption.data}


action(input=Refund, name="rules_refund")(refunding)
action(
    input=Refund,
    name="rules_declared",
    policy=ApprovalPolicy(
        rules=(
            Rule(name="tiny", when="data.amount < 10.0", then=Approve()),
            Rule(name="huge", when="data.amount > 10000.0", then=Reject("Refunds over 10,000 go to finance")),
            Rule(name="big", when="data.amount > 1000.0", then=RequireApprovals(2)),
        )
    ),
)(refunding)
action(input=Refund, answer=Verdict, name="rules_typed")(refunding)
action(input=Refund, name="rules_manual", policy=ApprovalPolicy(auto_approve=False))(refunding)
action(input=Refund, name="rules_separated", policy=ApprovalPolicy(requester_may_approve=False))(refunding)


def start(team: Team, name: str, amount: float, by: Any = None, customer: str = "ada") -> Run:
    return engine.start_run(name, {"customer": customer, "amount": amount}, team, by)


def only(run: Run) -> Interrupt:
    return Interrupt.objects.get(run=run)


def team_rule(team: Team, name: str, when: str, then: str, **fields: Any) -> TeamRule:
    return TeamRule.objects.create(team=team, name=name, when=when, then=then, **fields)


def test_a_declared_rule_approves_as_a_decision_recorded_as_the_rule(team: Team) -> None:
    run = start(team, "rules_declared", 5)
    run.refresh_from_db()
    it = only(run)
    assert (it.status, it.decided_by_name, it.decided_via) == ("approved", "rule: tiny", "rule")
    assert run.status == Run.Status.COMPLETED
    assert run.output == {"answer": {"approved": True, "comment": ""}}
    kinds = list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
    assert kinds[kinds.index("interrupted") :][:3] == ["interrupted", "approved", "resumed"]
    approved = RunEvent.objects.get(run=run, kind="approved")
    assert approved.detail["policy"] == "rule: tiny"


def test_a_declared_rule_rejects_with_its_reason_and_the_first_match_wins(team: Team) -> None:
    run = start(team, "rules_declared", 20000)
    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.REJECTED, "Refunds over 10,000 go to finance")
    assert only(run).decided_by_name == "rule: huge"  # "big" holds too, but comes after


def test_require_assign_and_route_set_who_decides_and_leave_it_pending(
    team: Team, other_team: Team, reviewer: User, second_reviewer: User
) -> None:
    it = only(start(team, "rules_declared", 5000))
    assert (it.status, it.approvals_required) == ("pending", 2)
    team_rule(team, "to-reviewer2", 'data.customer == "bob"', "assign", assignees="reviewer2")
    team_rule(team, "to-payroll", 'data.customer == "carol"', "route", route_to=other_team)
    bob = only(start(team, "rules_refund", 50, customer="bob"))
    assert (bob.status, bob.assignees) == ("pending", ["reviewer2"])
    event = RunEvent.objects.get(interrupt=bob, kind="interrupted")
    assert event.detail["rule"] == {"rule": "to-reviewer2", "then": "assign to reviewer2"}
    with pytest.raises(engine.NotAllowed):
        engine.resume(bob, {"approved": True}, reviewer)
    engine.resume(bob, {"approved": True}, second_reviewer)
    carol = only(start(team, "rules_refund", 50, customer="carol"))
    assert carol.team_id == other_team.pk and carol.status == "pending"
    with pytest.raises(engine.NotAllowed):
        engine.resume(carol, {"approved": True}, reviewer)
    payroll = member(other_team, "payroll9")
    engine.resume(carol, {"approved": True}, payroll)
    assert Run.objects.get(pk=carol.run_id).status == Run.Status.COMPLETED


def test_team_rules_go_first_by_position_and_see_input_team_requester(team: Team, requester: User) -> None:
    team_rule(team, "second", "true", "reject", reason="everything else", position=2)
    team_rule(
        team,
        "first",
        'action == "rules_declared" && team == "finance" && requester == "requester1"'
        ' && input.customer == "ada"',
        "approve",
        position=1,
    )
    run = start(team, "rules_declared", 5000, by=requester)  # the action's "big" would require 2
    assert only(run).decided_by_name == "rule: first"
    other = start(team, "rules_declared", 5000)  # no requester: "first" does not hold
    assert only(other).decided_by_name == "rule: second"


def test_a_rule_for_another_action_or_disabled_does_not_apply(team: Team) -> None:
    team_rule(team, "other", "true", "approve", action="rules_typed")
    team_rule(team, "off", "true", "approve", enabled=False)
    assert only(start(team, "rules_refund", 1)).status == "pending"


def test_a_rule_that_fails_at_run_time_leaves_it_to_people_and_says_why(team: Team) -> None:
    team_rule(team, "broken", "data.missing > 3", "reject", reason="no", position=1)
    team_rule(team, "later", "true", "approve", position=2)
    it = only(start(team, "rules_refund", 1))
    assert it.status == "pending"
    detail = RunEvent.objects.get(interrupt=it, kind="interrupted").detail
    assert detail["rule_failed"]["rule"] == "broken"
    assert "missing" in detail["rule_failed"]["error"]
    TeamRule.objects.filter(name="broken").update(when="data.amount")  # not true or false
    rules.rules_changed(team.pk)
    it = only(start(team, "rules_refund", 1))
    assert it.status == "pending"
    assert (
        "not true or false"
        in RunEvent.objects.get(interrupt=it, kind="interrupted").detail["rule_failed"]["error"]
    )


def test_auto_approve_false_is_never_approved_by_a_rule_but_may_be_rejected(team: Team) -> None:
    team_rule(team, "all", "data.amount < 100.0", "approve")
    it = only(start(team, "rules_manual", 1))
    assert it.status == "pending"
    detail = RunEvent.objects.get(interrupt=it, kind="interrupted").detail
    assert "auto_approve" in detail["rule_failed"]["error"]
    team_rule(team, "no", "data.amount > 100.0", "reject", reason="too much", position=0)
    assert only(start(team, "rules_manual", 500)).status == "rejected"
    with pytest.raises(ValueError, match="forbids automatic approval"):
        ApprovalPolicy(auto_approve=False, rules=(Rule(name="x", when="true", then=Approve()),))


def test_a_rule_answer_must_fit_the_answer_model(team: Team) -> None:
    with pytest.raises(TypeError, match="rule 'bad'.s answer of rules_typed_bad does not fit"):
        action(
            input=Refund,
            answer=Verdict,
            name="rules_typed_bad",
            policy=ApprovalPolicy(rules=(Rule(name="bad", when="true", then=Approve({"note": 3})),)),
        )(refunding)
    team_rule(team, "typed", "true", "approve", answer={"approved": True, "note": "small"})
    run = start(team, "rules_typed", 1)
    run.refresh_from_db()
    assert run.output == {"answer": {"approved": True, "note": "small"}}
    TeamRule.objects.filter(name="typed").update(answer={"approved": "perhaps"})
    rules.rules_changed(team.pk)
    it = only(start(team, "rules_typed", 1))
    assert it.status == "pending"
    assert (
        "does not fit"
        in RunEvent.objects.get(interrupt=it, kind="interrupted").detail["rule_failed"]["error"]
    )


def test_a_condition_that_is_not_cel_is_refused_naming_the_position() -> None:
    with pytest.raises(ConditionError, match=r"rule 'x': line 1, column 14: the condition ends too early"):
        Rule(name="x", when="data.amount <", then=Approve())
    with pytest.raises(ConditionError, match=r"line 2, column 3"):
        Rule(name="x", when="data.amount < 3 &&\n  )", then=Approve())
    with pytest.raises(ConditionError, match="Undefined variable or function: 'amount'"):
        Rule(name="x", when="amount < 3", then=Approve())
    assert isinstance(Rule(name="ok", when="has(data.amount)", then=AssignTo(("a",))).then, AssignTo)
    assert RouteTo("payroll").describe() == "route to payroll"


def test_a_reviewer_deciding_as_the_rule_does_gets_already_decided_exactly_once(
    team: Team, reviewer: User
) -> None:
    """The rule decides in the transaction that creates the interrupt: a reviewer racing it
    (here, the moment the row exists) loses, and the log has one decision."""
    seen: list[Any] = []
    ready = threading.Event()

    def reviewer_decides() -> None:
        ready.wait(10)
        for _ in range(200):
            it = Interrupt.objects.filter(run__action="rules_declared").first()
            if it is not None:
                try:
                    engine.resume(it, {"approved": True}, reviewer)
                    seen.append("won")
                except engine.AlreadyDecided:
                    seen.append("lost")
                return
            threading.Event().wait(0.005)

    thread = threading.Thread(target=reviewer_decides)
    thread.start()
    ready.set()
    run = start(team, "rules_declared", 5)
    thread.join(20)
    assert seen == ["lost"]
    assert RunEvent.objects.filter(run=run, kind__in=["approved", "rejected"]).count() == 1


# Standing grants


def test_a_grant_for_the_same_arguments_and_requester_approves_later_calls(
    team: Team, reviewer: User, requester: User
) -> None:
    first = only(start(team, "rules_refund", 30, by=requester))
    engine.resume(first, {"approved": True, "comment": "ok"}, reviewer)
    grant = rules.give_grant(first, reviewer, lasting="hour", answer={"approved": True, "comment": "ok"})
    second = only(start(team, "rules_refund", 30, by=requester))
    assert (second.status, second.decided_via) == ("approved", "grant")
    assert second.decided_by_name == f"grant #{grant.pk} (reviewer1)"
    assert Run.objects.get(pk=second.run_id).output == {"answer": {"approved": True, "comment": "ok"}}
    assert only(start(team, "rules_refund", 31, by=requester)).status == "pending"  # other arguments
    assert only(start(team, "rules_refund", 30)).status == "pending"  # another requester (none)
    grant.refresh_from_db()
    assert grant.uses == 1


def test_a_grant_by_condition_expires_and_is_revoked_at_once(
    team: Team, reviewer: User, requester: User
) -> None:
    first = only(start(team, "rules_refund", 30, by=requester))
    engine.resume(first, {"approved": True}, reviewer)
    grant = rules.give_grant(first, reviewer, lasting="revoked", condition="data.amount <= 50.0")
    assert only(start(team, "rules_refund", 45, by=requester)).status == "approved"
    assert only(start(team, "rules_refund", 60, by=requester)).status == "pending"
    assert rules.revoke_grant(grant, reviewer) is True
    assert rules.revoke_grant(grant, reviewer) is False
    assert only(start(team, "rules_refund", 45, by=requester)).status == "pending"
    hourly = rules.give_grant(first, reviewer, lasting="hour", condition="true")
    Grant.objects.filter(pk=hourly.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    rules.rules_changed(team.pk)
    assert only(start(team, "rules_refund", 45, by=requester)).status == "pending"
    with pytest.raises(ConditionError):
        rules.give_grant(first, reviewer, lasting="hour", condition="data.amount <")


def test_a_grant_for_this_run_covers_only_the_run(team: Team, reviewer: User) -> None:
    first = only(start(team, "rules_refund", 30))
    with pytest.raises(ValueError, match="no requester"):
        rules.give_grant(first, reviewer, lasting="hour")
    grant = rules.give_grant(first, reviewer, lasting="run")
    assert grant.run_id == first.run_id and grant.expires_at is None
    assert only(start(team, "rules_refund", 30)).status == "pending"  # another run


def test_no_grant_lets_its_giver_approve_what_they_may_not(
    team: Team, reviewer: User, requester: User
) -> None:
    """Separation of duties: a grant is its giver's approval. It does not approve the giver's
    own runs where they may not, nor what they are no longer allowed to decide, nor what needs
    several people, nor an action that forbids automatic approval."""
    mine = only(start(team, "rules_separated", 30, by=reviewer))
    other = only(start(team, "rules_separated", 30, by=requester))
    engine.resume(other, {"approved": True}, reviewer)
    rules.give_grant(other, reviewer, lasting="revoked", condition="true")
    assert only(start(team, "rules_separated", 30, by=requester)).status == "approved"
    assert mine.status == "pending"
    Grant.objects.create(
        team=team, action="rules_separated", granted_by=reviewer, granted_by_name="reviewer1",
        condition="true", requester=f"user:{reviewer.pk}",
    )  # fmt: skip
    assert only(start(team, "rules_separated", 30, by=reviewer)).status == "pending"
    team.members.remove(reviewer)
    rules.rules_changed(team.pk)
    assert only(start(team, "rules_separated", 30, by=requester)).status == "pending"
    manual = only(start(team, "rules_manual", 1, by=requester))
    with pytest.raises(ValueError, match="automatically"):
        rules.give_grant(manual, requester, lasting="hour")


# Delegation


def test_a_delegate_gets_what_is_assigned_to_someone_away_and_nobody_counts_twice(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    now = timezone.now()
    team_rule(team, "pair", 'data.customer == "pair"', "assign", assignees="reviewer1,reviewer2")
    team_rule(team, "one", 'data.customer == "one"', "assign", assignees="reviewer1")
    pending = only(start(team, "rules_refund", 1, customer="one"))
    rules.set_away(reviewer, second_reviewer, now - timedelta(minutes=1), now + timedelta(days=1))
    pending.refresh_from_db()
    assert pending.assignees == ["reviewer2"]  # what was pending moved
    assert RunEvent.objects.get(interrupt=pending, kind="assigned").detail["delegated"] == {
        "reviewer1": "reviewer2"
    }
    it = only(start(team, "rules_refund", 1, customer="one"))
    assert it.assignees == ["reviewer2"]
    assert RunEvent.objects.get(interrupt=it, kind="interrupted").detail["delegated"] == {
        "reviewer1": "reviewer2"
    }
    both = only(start(team, "rules_refund", 1, customer="pair"))
    assert both.assignees == ["reviewer1", "reviewer2"]
    assert (
        "already one of its approvers"
        in RunEvent.objects.get(interrupt=both, kind="interrupted").detail["not_delegated"]["reviewer1"]
    )
    with pytest.raises(ValueError):
        rules.set_away(reviewer, reviewer, now, now + timedelta(days=1))
    outsider = User.objects.create_user("nobody")
    with pytest.raises(ValueError, match="none of your teams"):
        rules.set_away(reviewer, outsider, now, now + timedelta(days=1))


def test_a_delegate_who_started_the_run_does_not_take_it_over_against_separation_of_duties(
    team: Team, reviewer: User, requester: User
) -> None:
    now = timezone.now()
    team_rule(team, "one", "true", "assign", assignees="reviewer1")
    rules.set_away(reviewer, requester, now, now + timedelta(days=1))
    it = only(start(team, "rules_separated", 1, by=requester))
    assert it.assignees == ["reviewer1"]
    assert (
        "started the run"
        in RunEvent.objects.get(interrupt=it, kind="interrupted").detail["not_delegated"]["reviewer1"]
    )
