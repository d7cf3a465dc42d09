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
from actions.engine import delegation, grants, rules
from actions.models import Delegation, Grant, Interrupt, Run, RunEvent, Team, TeamRule
from tests.conftest import member

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]


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


def test_a_rule_whose_outcome_is_not_one_is_refused_where_it_is_declared() -> None:
    """then="approve" (a string) was a rule that silently never applied (issue 36)."""
    for then in ("approve", None, {"approve": True}, Approve):
        with pytest.raises(TypeError, match=r"rule 'x': then must be Approve\(\), Reject\(reason\)"):
            Rule(name="x", when="true", then=then)  # type: ignore[arg-type]
    assert Rule(name="x", when="true", then=Approve()).then == Approve()


def test_a_condition_that_is_not_cel_is_refused_naming_the_position() -> None:
    with pytest.raises(ConditionError, match=r"rule 'x': line 1, column 14: the condition ends too early"):
        Rule(name="x", when="data.amount <", then=Approve())
    with pytest.raises(ConditionError, match=r"line 2, column 3"):
        Rule(name="x", when="data.amount < 3 &&\n  )", then=Approve())
    with pytest.raises(ConditionError, match="there is no variable 'amount'"):
        Rule(name="x", when="amount < 3", then=Approve())
    with pytest.raises(ConditionError, match="there is no variable 'bogus'"):
        Rule(name="x", when="data == null || bogus > 1", then=Approve())  # not evaluated with null data
    # Nested comprehensions multiply the work: three levels could keep a transaction busy.
    with pytest.raises(ConditionError, match="nest at most 2 deep"):
        Rule(name="x", when="data.a.all(x, data.a.all(y, data.a.all(z, x + y + z > 0)))", then=Approve())
    assert Rule(name="ok", when='data.a.exists(x, x.tags.exists(t, t == "all("))', then=Approve()).name
    assert Rule(name="ok", when='type(data.n) == int && data.note == "amount"', then=Approve()).name
    # A method of the values' types is not refused for the null the check evaluates with.
    assert Rule(name="ok", when='requester.startsWith("agent-")', then=Reject("x")).name == "ok"
    assert isinstance(Rule(name="ok", when="has(data.amount)", then=AssignTo(("a",))).then, AssignTo)
    assert RouteTo("payroll").describe() == "route to payroll"


@pytest.mark.django_db(transaction=True)  # threads with their own connections
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
    grant = grants.give_grant(first, reviewer, lasting="hour", answer={"approved": True, "comment": "ok"})
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
    grant = grants.give_grant(first, reviewer, lasting="revoked", condition="data.amount <= 50.0")
    assert only(start(team, "rules_refund", 45, by=requester)).status == "approved"
    assert only(start(team, "rules_refund", 60, by=requester)).status == "pending"
    assert grants.revoke_grant(grant, reviewer) is True
    assert grants.revoke_grant(grant, reviewer) is False
    assert only(start(team, "rules_refund", 45, by=requester)).status == "pending"
    hourly = grants.give_grant(first, reviewer, lasting="hour", condition="true")
    Grant.objects.filter(pk=hourly.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    rules.rules_changed(team.pk)
    assert only(start(team, "rules_refund", 45, by=requester)).status == "pending"
    with pytest.raises(grants.GrantRefused, match="column 14"):
        grants.give_grant(first, reviewer, lasting="hour", condition="data.amount <")


@pytest.mark.django_db(transaction=True)  # threads with their own connections
def test_a_routed_teams_grant_is_judged_before_the_transaction_over_its_own_name(
    team: Team, other_team: Team, requester: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routed to payroll, a refund is approved by payroll's grant where its condition holds
    (``team`` is payroll there), and that condition, like every other, runs before the
    transaction that records the pause: never under the write lock (issue 35)."""
    from django.db import transaction

    team_rule(team, "to-payroll", 'data.customer == "carol"', "route", route_to=other_team)
    first = only(start(team, "rules_refund", 30, by=requester, customer="carol"))
    payroll = member(other_team, "payroll9")
    engine.resume(first, {"approved": True}, payroll)
    grants.give_grant(first, payroll, lasting="revoked", condition='data.amount <= 50.0 && team == "payroll"')
    judged_in_a_transaction = []
    holds = rules.holds

    def watched(condition: Any, given: Any) -> bool:
        judged_in_a_transaction.append(transaction.get_connection().in_atomic_block)
        return holds(condition, given)

    monkeypatch.setattr(rules, "holds", watched)
    small = only(start(team, "rules_refund", 45, by=requester, customer="carol"))
    assert (small.team_id, small.status) == (other_team.pk, "approved")
    assert small.decided_by_name.startswith("grant #")
    assert only(start(team, "rules_refund", 60, by=requester, customer="carol")).status == "pending"
    assert judged_in_a_transaction and not any(judged_in_a_transaction)


def test_one_approve_says_what_it_made_and_gives_its_grant_in_the_same_transaction(
    team: Team, reviewer: User, second_reviewer: User, requester: User
) -> None:
    """engine.approve, what every page and channel approves through: a typed account of the
    decision (the N-of-M count, whose approvals a different answer set aside), and a standing
    grant given with it or not at all."""
    team_rule(team, "two", "true", "require", approvals=2, action="rules_typed")
    typed = only(start(team, "rules_typed", 5))
    first = engine.approve(typed, {"approved": True, "note": "a"}, reviewer)
    assert (first.interrupt.is_pending, first.approvals, first.restarted, first.grant) == (True, 1, (), None)
    second = engine.approve(typed, {"approved": True, "note": "b"}, second_reviewer)
    assert (second.interrupt.is_pending, second.approvals, second.restarted) == (True, 1, ("reviewer1",))
    third = engine.approve(typed, {"approved": True, "note": "b"}, reviewer)
    assert (third.interrupt.status, third.approvals) == ("approved", 2)

    nobody = only(start(team, "rules_refund", 30))  # no requester: only a grant for this run
    with pytest.raises(grants.GrantRefused, match="no requester"):
        engine.approve(nobody, {"approved": True}, reviewer, grant=engine.GrantAsked("hour"))
    nobody.refresh_from_db()
    assert nobody.status == "pending" and not Grant.objects.exists()  # neither

    asked = only(start(team, "rules_refund", 30, by=requester))
    made = engine.approve(
        asked, {"approved": True}, reviewer, grant=engine.GrantAsked("revoked", "data.amount <= 50.0")
    )
    assert made.interrupt.status == "approved" and made.grant == Grant.objects.get()
    assert made.grant.condition == "data.amount <= 50.0" and made.grant.source_id == asked.pk
    assert (
        only(start(team, "rules_refund", 45, by=requester)).decided_by_name
        == f"grant #{made.grant.pk} (reviewer1)"
    )


def test_a_grant_for_this_run_covers_only_the_run(team: Team, reviewer: User) -> None:
    first = only(start(team, "rules_refund", 30))
    with pytest.raises(grants.GrantRefused, match="no requester"):
        grants.give_grant(first, reviewer, lasting="hour")
    grant = grants.give_grant(first, reviewer, lasting="run")
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
    grants.give_grant(other, reviewer, lasting="revoked", condition="true")
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
    with pytest.raises(grants.GrantRefused, match="automatically"):
        grants.give_grant(manual, requester, lasting="hour")


# Delegation


def test_a_delegate_gets_what_is_assigned_to_someone_away_and_nobody_counts_twice(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    now = timezone.now()
    team_rule(team, "pair", 'data.customer == "pair"', "assign", assignees="reviewer1,reviewer2")
    team_rule(team, "one", 'data.customer == "one"', "assign", assignees="reviewer1")
    pending = only(start(team, "rules_refund", 1, customer="one"))
    delegation.set_away(reviewer, second_reviewer, now - timedelta(minutes=1), now + timedelta(days=1))
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
        delegation.set_away(reviewer, reviewer, now, now + timedelta(days=1))
    outsider = User.objects.create_user("nobody")
    with pytest.raises(ValueError, match="not an approver or admin in any team where you decide"):
        delegation.set_away(reviewer, outsider, now, now + timedelta(days=1))


def test_a_delegate_who_started_the_run_does_not_take_it_over_against_separation_of_duties(
    team: Team, reviewer: User, requester: User
) -> None:
    now = timezone.now()
    team_rule(team, "one", "true", "assign", assignees="reviewer1")
    delegation.set_away(reviewer, requester, now, now + timedelta(days=1))
    it = only(start(team, "rules_separated", 1, by=requester))
    assert it.assignees == ["reviewer1"]
    assert (
        "started the run"
        in RunEvent.objects.get(interrupt=it, kind="interrupted").detail["not_delegated"]["reviewer1"]
    )


# The admin: refused when saved, dry run before


@pytest.fixture
def admin_client(db: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root"))
    return client


def rule_form(team: Team, **fields: Any) -> dict[str, Any]:
    return {
        "team": team.pk, "name": "small refunds", "action": "rules_refund", "when": "data.amount < 40.0",
        "then": "approve", "answer": "", "reason": "", "approvals": "", "assignees": "", "route_to": "",
        "position": "0", "enabled": "on", **fields,
    }  # fmt: skip


def test_the_admin_refuses_a_rule_that_cannot_work_naming_what(admin_client: Any, team: Team) -> None:
    url = "/admin/actions/teamrule/add/"
    cases = {
        "data.amount <": "line 1, column 14: the condition ends too early",
        "amout < 3": "there is no variable &#x27;amout&#x27;",
    }
    for when, said in cases.items():
        response = admin_client.post(url, rule_form(team, when=when))
        assert response.status_code == 200 and said in response.content.decode()
    refused = {
        "then=reject": ({"then": "reject"}, "must give the reason"),
        "approve manual": ({"action": "rules_manual"}, "may not be approved automatically"),
        "typed without": ({"action": "rules_typed"}, "takes a typed answer"),
        "typed wrong": ({"action": "rules_typed", "answer": '{"approved": "x"}'}, "does not fit rules_typed"),
        "unknown action": ({"action": "nope"}, "There is no action named"),
        "assign nobody": (
            {"then": "assign", "assignees": "ghost"},
            "Not an approver or admin of Finance: ghost",
        ),
        "route self": ({"then": "route", "route_to": str(team.pk)}, "another team"),
        "require": ({"then": "require"}, "how many people"),
    }
    for case, (fields, said) in refused.items():
        response = admin_client.post(url, rule_form(team, **fields))
        assert said in response.content.decode(), case
    assert not TeamRule.objects.exists()
    response = admin_client.post(url, rule_form(team))
    assert response.status_code == 302 and TeamRule.objects.get().when == "data.amount < 40.0"


def test_the_dry_run_shows_what_the_rule_would_have_decided_without_saving(
    admin_client: Any, team: Team, reviewer: User
) -> None:
    for amount in (10, 30, 50, 70):
        it = only(start(team, "rules_refund", amount))
        if amount == 10:
            engine.reject(it, "no", reviewer)
        elif amount == 30:
            engine.resume(it, {"approved": True}, reviewer)
    start(team, "rules_typed", 5)  # another action: not looked at by a rule for rules_refund
    team_rule(team, "first", "data.amount == 30.0", "reject", reason="x", position=0)
    response = admin_client.post(
        "/admin/actions/teamrule/add/", {**rule_form(team, position="5"), "_dryrun": "1"}
    )
    page = response.content.decode()
    assert response.status_code == 200, page
    assert (
        "Of the team's last <strong>5</strong> interrupts, the condition holds for <strong>2</strong>" in page
    )
    assert "people decided <strong>1</strong> the same way and <strong>1</strong> the other way" in page
    assert "An earlier rule of the team holds first for <strong>1</strong>" in page
    assert "— (rule “first” holds first)" in page
    assert TeamRule.objects.count() == 1  # nothing saved
    response = admin_client.post(
        "/admin/actions/teamrule/add/", {**rule_form(team, when="data.missing < 3"), "_dryrun": "1"}
    )
    assert "fails to evaluate on <strong>4</strong>" in response.content.decode()
    bad = admin_client.post(
        "/admin/actions/teamrule/add/", {**rule_form(team, when="data.amount <"), "_dryrun": "1"}
    )
    assert "column 14" in bad.content.decode() and "Dry run:" not in bad.content.decode()


# The pages: granting from the decision form, the Grants page, Away


def signed_in(user: User) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_approving_with_a_grant_from_the_form_approves_the_next_same_request(
    team: Team, reviewer: User, requester: User, outsider: User
) -> None:
    first = only(start(team, "rules_refund", 30, by=requester))
    client = signed_in(reviewer)
    page = client.get(f"/interrupts/{first.pk}/").content.decode()
    assert "Approve, and allow the same" in page and "from <strong>requester1</strong>" in page
    bad = client.post(
        f"/interrupts/{first.pk}/approve/",
        {
            "comment": "",
            "grant-lasting": "hour",
            "grant-scope": "condition",
            "grant-condition": "data.amount <",
        },
    )
    assert bad.status_code == 422 and "column 14" in bad.content.decode()
    assert Interrupt.objects.get(pk=first.pk).status == "pending" and not Grant.objects.exists()
    done = client.post(
        f"/interrupts/{first.pk}/approve/",
        {"answer-comment": "fine", "grant-lasting": "hour", "grant-scope": "same"},
    )
    assert done.status_code == 302
    grant = Grant.objects.get()
    assert (grant.granted_by, grant.requester_name, grant.answer) == (
        reviewer,
        "requester1",
        {"approved": True, "comment": "fine"},
    )
    assert grant.expires_at is not None and grant.expires_at - timezone.now() > timedelta(minutes=59)
    assert only(start(team, "rules_refund", 30, by=requester)).decided_via == "grant"
    listed = client.get("/grants/").content.decode()
    assert f'id="grant-{grant.pk}"' in listed and "the same arguments, from requester1" in listed
    assert signed_in(outsider).post(f"/grants/{grant.pk}/revoke/").status_code == 404
    assert f'id="grant-{grant.pk}"' not in signed_in(outsider).get("/grants/").content.decode()
    assert signed_in(requester).post(f"/grants/{grant.pk}/revoke/").status_code == 302  # any member
    grant.refresh_from_db()
    assert grant.revoked_at is not None and grant.revoked_by_name == "requester1"
    assert only(start(team, "rules_refund", 30, by=requester)).status == "pending"


def test_no_grant_is_offered_or_taken_where_it_may_not_apply(
    team: Team, reviewer: User, requester: User
) -> None:
    manual = only(start(team, "rules_manual", 30, by=requester))
    client = signed_in(reviewer)
    assert "allow the same" not in client.get(f"/interrupts/{manual.pk}/").content.decode()
    refused = client.post(
        f"/interrupts/{manual.pk}/approve/", {"answer-comment": "", "grant-lasting": "revoked"}
    )
    assert refused.status_code == 422 and "takes no grant" in refused.content.decode()
    assert Interrupt.objects.get(pk=manual.pk).status == "pending" and not Grant.objects.exists()
    unknown = client.post(
        f"/interrupts/{manual.pk}/approve/", {"answer-comment": "", "grant-lasting": "forever"}
    )
    assert unknown.status_code == 422 and Interrupt.objects.get(pk=manual.pk).status == "pending"


def test_away_hands_assigned_approvals_to_a_teammate_and_back(
    team: Team, reviewer: User, second_reviewer: User, outsider: User
) -> None:
    team_rule(team, "one", "true", "assign", assignees="reviewer1")
    client = signed_in(reviewer)
    page = client.get("/settings/away/").content.decode()
    assert "reviewer2" in page and "payroll1" not in page  # teammates only
    now = timezone.now()
    form = {
        "starts_at": now.strftime("%Y-%m-%dT%H:%M"),
        "ends_at": (now + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M"),
    }
    wrong = client.post("/settings/away/", {**form, "delegate": outsider.pk})
    assert wrong.status_code == 422 and not Delegation.objects.exists()
    backwards = client.post(
        "/settings/away/", {**form, "delegate": second_reviewer.pk, "ends_at": form["starts_at"]}
    )
    assert backwards.status_code == 422 and "after the start" in backwards.content.decode()
    assert client.post("/settings/away/", {**form, "delegate": second_reviewer.pk}).status_code == 302
    assert only(start(team, "rules_refund", 1)).assignees == ["reviewer2"]
    assert (
        "You decide for <strong>reviewer1</strong>"
        in signed_in(second_reviewer).get("/settings/away/").content.decode()
    )
    absence = Delegation.objects.get()
    assert client.post(f"/settings/away/{absence.pk}/back/").status_code == 302
    assert only(start(team, "rules_refund", 2)).assignees == ["reviewer1"]


# What the review found: each holds


def test_a_grant_stops_the_moment_its_giver_is_deactivated_or_it_is_revoked_whatever_is_cached(
    team: Team, reviewer: User, requester: User
) -> None:
    first = only(start(team, "rules_refund", 30, by=requester))
    engine.resume(first, {"approved": True}, reviewer)
    grant = grants.give_grant(first, reviewer, lasting="revoked", condition="true")
    assert only(start(team, "rules_refund", 30, by=requester)).status == "approved"
    User.objects.filter(pk=reviewer.pk).update(is_active=False)  # no rule changed: the cache stays
    assert only(start(team, "rules_refund", 30, by=requester)).status == "pending"
    User.objects.filter(pk=reviewer.pk).update(is_active=True)
    assert only(start(team, "rules_refund", 30, by=requester)).status == "approved"
    # Revoked by another process, this one's cache not yet told: the use itself refuses it.
    Grant.objects.filter(pk=grant.pk).update(revoked_at=timezone.now())
    assert only(start(team, "rules_refund", 30, by=requester)).status == "pending"
    assert Grant.objects.get(pk=grant.pk).uses == 2


def test_a_grant_does_not_stand_in_for_a_rule_that_failed(
    team: Team, reviewer: User, requester: User
) -> None:
    first = only(start(team, "rules_refund", 30, by=requester))
    engine.resume(first, {"approved": True}, reviewer)
    grants.give_grant(first, reviewer, lasting="revoked", condition="true")
    team_rule(team, "typo", "data.amout > 10.0", "reject", reason="too much")
    it = only(start(team, "rules_refund", 30, by=requester))
    assert it.status == "pending"
    assert RunEvent.objects.get(interrupt=it, kind="interrupted").detail["rule_failed"]["rule"] == "typo"


def test_routing_applies_the_other_teams_policy(team: Team, other_team: Team, reviewer: User) -> None:
    from actions.models import Policy

    Policy.objects.create(team=team, action="rules_refund", assignees="reviewer1", approvals_required=2)
    team_rule(team, "to-payroll", "true", "route", route_to=other_team)
    it = only(start(team, "rules_refund", 1))
    # Payroll's own people decide it (the first team's assignees are not theirs), as many of them
    # as the first team asked at least: a later layer never loosens an earlier one (issue 36).
    assert (it.team_id, it.assignees, it.approvals_required) == (other_team.pk, [], 2)


def test_a_delegate_does_not_take_a_seat_whose_holder_already_approved(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    third = member(team, "reviewer3")
    team_rule(team, "pair", "true", "assign", assignees="reviewer1,reviewer2")
    it = only(start(team, "rules_refund", 5000))
    Interrupt.objects.filter(pk=it.pk).update(approvals_required=2)  # four eyes, both assigned
    it.refresh_from_db()
    engine.resume(it, {"approved": True}, reviewer)
    now = timezone.now()
    delegation.set_away(reviewer, third, now - timedelta(minutes=1), now + timedelta(days=1))
    it.refresh_from_db()
    assert it.assignees == ["reviewer1", "reviewer2"]  # reviewer1's approval counts: no second seat
    with pytest.raises(engine.NotAllowed):
        engine.resume(it, {"approved": True}, third)


def test_saving_a_team_never_puts_back_an_older_rules_version(team: Team) -> None:
    loaded = Team.objects.get(pk=team.pk)
    team_rule(team, "new", "true", "reject", reason="x")
    changed = Team.objects.get(pk=team.pk).rules_version
    loaded.name = "Finance and Ops"
    loaded.save()
    assert Team.objects.get(pk=team.pk).rules_version == changed


def test_a_calls_arguments_that_cannot_be_stored_fail_the_step_saying_so() -> None:
    from actions.engine.driving import Pause, StepResult
    from actions.engine.steps import _checked

    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    result = StepResult(
        Run.Status.INTERRUPTED,
        pauses=[Pause("Call?", {"tool": "x"}, None, action="x", arguments={"a": deep})],
    )
    checked = _checked(Run(pk=1), result)
    assert checked.status == Run.Status.FAILED and "the call's arguments" in checked.error


def test_the_dry_run_needs_the_permission_to_view_interrupts(team: Team) -> None:
    from django.contrib.auth.models import Permission
    from django.test import Client

    staff = User.objects.create_user("ruler", password="pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["add_teamrule", "change_teamrule"]))
    client = Client()
    client.force_login(staff)
    response = client.post("/admin/actions/teamrule/add/", {**rule_form(team), "_dryrun": "1"})
    assert response.status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_interrupt"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.post("/admin/actions/teamrule/add/", {**rule_form(team), "_dryrun": "1"}).status_code == 200
