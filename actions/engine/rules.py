"""What happens to an interrupt when it is created, before anyone sees it: the rules, and where
they hand over to standing grants (actions.engine.grants) and delegation
(actions.engine.delegation).

In the transaction that records the pause (actions.engine.steps.record), from what their
conditions said when evaluated just before it (``judge``: none runs under the transaction's
write lock, and each is bounded before it runs, actions.conditions):

1. The team's rules (admin: Rules), by position, then the action's own
   (``ApprovalPolicy(rules=...)``): the first whose condition holds decides (approve, reject),
   or sets who decides (require N approvals, assign to users, route to another team). A
   condition that fails to evaluate stops there: the interrupt is left to people, and the event
   log says which rule failed and why (a later rule cannot know what an earlier one would have
   said).
2. Without a rule's decision, a live standing grant that covers it approves it, as long as
   whoever gave the grant could still approve it themself (their team, the assignees, separation
   of duties, one approver).
3. Assignees who are away are replaced by their delegates, unless that would make one person
   two of the approvers, or a delegate who may not approve it.

A rule's or a grant's decision is an ordinary decision (actions.engine.decisions.decide), made
by a policy: recorded as ``rule: <name>`` or ``grant #<id> (<who>)``, and the run goes on as it
would after a person's. ``auto_approve=False`` on an action's policy forbids both to approve.

Each process keeps a team's rules and grants compiled, and checks one number per interrupt (the
team's ``rules_version``, new on every change) to know they are current.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone

from actions.conditions import (
    Condition,
    ConditionError,
    ConditionInput,
    ConditionTooCostly,
    compile_condition,
)
from actions.core import (
    ApprovalPolicy,
    Approve,
    AssignTo,
    Reject,
    RequireApprovals,
    RouteTo,
    RuleOutcome,
    describe_errors,
    registry,
)
from actions.engine import delegation, store
from actions.engine.driving import arguments_hash
from actions.engine.policies import policy_fields, with_override
from actions.engine.schemas import schema_errors
from actions.models import Grant, Interrupt, Run, Team, TeamRule

logger = logging.getLogger(__name__)

PLAIN_APPROVAL = {"approved": True, "comment": ""}


@dataclass(frozen=True)
class Compiled:
    """A rule ready to evaluate: its name, the action it is for ("" any), its program and
    what it does."""

    name: str
    action: str
    program: Condition
    then: RuleOutcome
    team_rule_id: int | None = None
    order: tuple[int, int] = (0, 0)  # a team rule's (position, id)

    def covers(self, action: str) -> bool:
        return not self.action or self.action == action


@dataclass(frozen=True)
class TeamSet:
    version: int
    slug: str
    rules: tuple[Compiled, ...]
    grants: tuple[tuple[Grant, Condition | None], ...]


_cache: dict[int, TeamSet] = {}
_cache_lock = threading.Lock()


def outcome_of(rule: TeamRule) -> RuleOutcome:
    """What a team's rule does, as the action's own rules say it. ValueError when its fields do
    not make an outcome (the admin's form says which)."""
    then = TeamRule.Then
    if rule.then == then.APPROVE:
        return Approve(rule.answer)
    if rule.then == then.REJECT:
        return Reject(rule.reason)
    if rule.then == then.REQUIRE:
        if not rule.approvals:
            raise ValueError("say how many approvals it requires")
        return RequireApprovals(rule.approvals)
    if rule.then == then.ASSIGN:
        return AssignTo(tuple(name.strip() for name in rule.assignees.split(",") if name.strip()))
    if rule.then == then.ROUTE:
        if rule.route_to is None:
            raise ValueError("say which team it routes to")
        return RouteTo(rule.route_to.slug)
    raise ValueError(f"unknown outcome {rule.then!r}")


def compile_team(team_id: int, version: int, slug: str) -> TeamSet:
    rules = []
    for row in TeamRule.objects.filter(team_id=team_id, enabled=True).select_related("route_to"):
        try:
            program = compile(row.when)
            rules.append(
                Compiled(row.name, row.action, program, outcome_of(row), row.pk, (row.position, row.pk))
            )
        except (ConditionError, ValueError) as exc:
            # Refused when saved; only a rule written around the admin gets here.
            logger.error("team %s: rule %r is skipped: %s", slug, row.name, exc)
    grants: list[tuple[Grant, Condition | None]] = []
    for grant in live_grants(Grant.objects.filter(team_id=team_id)):
        condition: Condition | None = None
        if grant.condition:
            try:
                condition = compile(grant.condition)
            except ConditionError as exc:
                logger.error("grant %s is skipped: %s", grant.pk, exc)
                continue
        grants.append((grant, condition))
    return TeamSet(version, slug, tuple(rules), tuple(grants))


def live_grants(grants: Any, now: datetime | None = None) -> Any:
    """The grants in force: not revoked, not expired, and (for a run's) while the run goes on."""
    now = now or timezone.now()
    return (
        grants.filter(revoked_at=None)
        .filter(Q(expires_at=None) | Q(expires_at__gt=now))
        .exclude(run__status__in=Run.FINISHED)
    )


def team_set(team_id: int, known: tuple[int, str] | None = None) -> TeamSet:
    """The team's rules and grants, compiled; read again only when they changed. ``known``:
    the team's rules version and slug, when the caller read them (store.team_policy)."""
    version, slug = known or Team.objects.filter(pk=team_id).values_list("rules_version", "slug").get()
    cached = _cache.get(team_id)
    if cached is not None and cached.version == version:
        return cached
    compiled = compile_team(team_id, version, slug)
    with _cache_lock:
        _cache[team_id] = compiled
    return compiled


def rules_changed(team_id: int) -> None:
    # A new random number rather than one more: a process's cache stays right across a
    # database restored from a backup, or a team id used again.
    Team.objects.filter(pk=team_id).update(rules_version=secrets.randbits(62))


@receiver([post_save, post_delete], sender=TeamRule)
@receiver([post_save, post_delete], sender=Grant)
def _bump(sender: Any, instance: TeamRule | Grant, **kwargs: Any) -> None:
    rules_changed(instance.team_id)


# What a condition sees


def requester_name(run: Run) -> str:
    """Who started the run, as conditions read it: a username, "API token <name>" (no username
    has a space), or "" for no one."""
    if run.started_by_id is None and run.started_by_token_id is None:
        return ""
    return run.started_by_name or ""


def requester_key(run: Run) -> str:
    """Who asked, as a grant is scoped to: a user, a token, or no one ("")."""
    if run.started_by_id is not None:
        return f"user:{run.started_by_id}"
    if run.started_by_token_id is not None:
        return f"token:{run.started_by_token_id}"
    return ""


def call_input(run: Run, arguments: Any) -> Any:
    """What the paused call was given: a tool's or a script call's arguments, else the run's
    input (a plain action pauses inside the call the run is)."""
    return arguments if arguments is not None else run.input


def arguments_key(run: Run, interrupt: Interrupt) -> str:
    """What a grant is for: the paused call's arguments (a service's question's are the question:
    its message, data and answer schema, as the approval driver records them)."""
    return arguments_hash(call_input(run, interrupt.arguments))


def context(data: Any, given: Any, action: str, team: str, requester: str) -> ConditionInput:
    values = {"data": data, "input": given, "action": action, "team": team, "requester": requester}
    return ConditionInput(values)


def compile(text: str) -> Condition:  # noqa: A001 - the engine's one way to compile a condition
    """A team's condition (a rule's, a grant's), compiled against the site's budget:
    ConditionError when it is not one, or could never be evaluated within the budget."""
    return compile_condition(text, settings.GRUNDLAG_CONDITION_BUDGET)


def holds(condition: Condition, given: ConditionInput) -> bool:
    """Whether ``condition`` is true over ``given``, within the site's budget (shared by every
    condition evaluated for one step's pauses). Raises what a failed condition raises: a
    ConditionTooCostly one is not evaluated at all."""
    result = condition.evaluate(given, settings.GRUNDLAG_CONDITION_BUDGET)
    if result is not True and result is not False:
        raise NotTrueOrFalse(f"the condition gave {result!r}, not true or false")
    return result


class NotTrueOrFalse(Exception):  # noqa: N818 - what the condition gave
    pass


def failure(exc: Exception) -> str:
    """Why a condition failed, as the event log and the dry run say it."""
    if isinstance(exc, (ConditionTooCostly, NotTrueOrFalse)):
        return str(exc)[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


@dataclass(frozen=True)
class Verdict:
    """What the rules say about one interrupt: the rule that holds (and its outcome), or the
    rule that failed to evaluate and why (the interrupt is then left to people)."""

    rule: Compiled | None = None
    failed: str = ""
    error: str = ""


def evaluate(rules: tuple[Compiled, ...] | list[Compiled], given: ConditionInput, action: str) -> Verdict:
    """The first rule for ``action`` whose condition holds. A condition that raises, gives
    something other than true or false, or is over the budget, stops the evaluation."""
    for rule in rules:
        if not rule.covers(action):
            continue
        try:
            if holds(rule.program, given):
                return Verdict(rule=rule)
        except Exception as exc:  # noqa: BLE001 - any failure of a condition leaves it to people
            return Verdict(failed=rule.name, error=failure(exc))
    return Verdict()


def declared_rules(policy: ApprovalPolicy, action: str) -> list[Compiled]:
    return [Compiled(rule.name, action, rule.program, rule.then) for rule in policy.rules]


# At creation


@dataclass
class Routed:
    """What the rules, grants and delegations made of a new interrupt: its fields changed
    before it is inserted, the decision to make once every pause of the step is inserted, and
    what the event log says about it."""

    fields: dict[str, Any]
    decision: tuple[str, Any] | None = None  # ("approve", answer) or ("reject", reason)
    decided_by: str = ""  # "rule: <name>" or "grant #<id> (<who>)"
    grant: Grant | None = None
    note: dict[str, Any] = field(default_factory=dict)
    teams: TeamSet | None = None  # the run's team's rules and grants
    given: ConditionInput | None = None  # what its conditions read
    # The run's team's grants with a condition, by id: whether the condition holds (evaluated
    # with the rules, so that the event says which failed and why).
    held: dict[int, bool] = field(default_factory=dict)
    # What the rule, delegation and the contract's last word changed (after the policies').
    contract: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Judged:
    """What the conditions say of one pause: the rules' verdict, and which of the team's
    conditional grants hold (and which failed, and why). Worked out before the transaction that
    records the pause (``judge``), so that no condition runs under its write lock."""

    given: ConditionInput | None = None
    verdict: Verdict = Verdict()
    held: dict[int, bool] = field(default_factory=dict)
    grant_failed: tuple[dict[str, Any], ...] = ()


def judge(
    run: Run,
    action_name: str,
    data: Any,
    arguments: Any,
    policy: ApprovalPolicy,
    teams: TeamSet,
    spent: int = 0,
) -> Judged:
    """Evaluate the conditions that could decide a new pause: the team's and the action's
    rules, then the conditions of the grants that could cover it (same action, same requester
    or run). ``spent``: the steps the conditions of the step's earlier pauses took (one budget
    for a whole step). Reads, writes nothing."""
    rules = [*teams.rules, *declared_rules(policy, action_name)]
    if not rules and not teams.grants:
        return Judged()
    given = context(data, call_input(run, arguments), action_name, teams.slug, requester_name(run))
    given.spent = spent
    verdict = evaluate(rules, given, action_name)
    if verdict.failed:
        return Judged(given, verdict)
    held: dict[int, bool] = {}
    failed: list[dict[str, Any]] = []
    target = None
    if verdict.rule is not None and isinstance(verdict.rule.then, RouteTo):
        target = Team.objects.filter(slug=verdict.rule.then.team).values_list("pk", flat=True).first()
    if target is None or target == run.team_id:
        _hold(teams, run, action_name, given, held, failed)
    else:
        # Routed: the grants that could approve it are the other team's alone (the first
        # team's would not apply there), their conditions over that team's name.
        theirs = team_set(target)
        there = context(data, given.values["input"], action_name, theirs.slug, requester_name(run))
        there.spent = given.spent
        _hold(theirs, run, action_name, there, held, failed)
        given.spent = there.spent
    return Judged(given, verdict, held, tuple(failed))


def _hold(
    teams: TeamSet,
    run: Run,
    action_name: str,
    given: ConditionInput,
    held: dict[int, bool],
    failed: list[dict[str, Any]],
) -> None:
    """Whether the conditions of ``teams``' grants that could cover the pause hold, into
    ``held`` (by grant) and ``failed``."""
    now, who = timezone.now(), requester_key(run)
    for grant, condition in teams.grants:
        # A keyed grant's condition too (a service's question's): evaluated here, not under
        # the recording transaction's lock.
        if condition is None or grant.action != action_name:
            continue
        if not grant.is_live(now) or not scoped(grant, run, who):
            continue
        try:
            held[grant.pk] = holds(condition, given)
        except Exception as exc:  # noqa: BLE001 - a condition that fails does not cover it
            held[grant.pk] = False
            failed.append({"grant": grant.pk, "error": failure(exc)})


def route(
    run: Run,
    action_name: str,
    fields: dict[str, Any],
    policy: ApprovalPolicy,
    teams: TeamSet,
    judged: Judged,
) -> Routed:
    """Apply the rules and delegations to a new interrupt's ``fields`` (policies.policy_fields),
    and say what decides it, if anything does, from what ``judge`` said of its conditions
    before the transaction (none is evaluated here, under its write lock; ``teams`` is what
    they were judged with). Grants are looked at once it is inserted (``grant_for``), where the
    granter's right to decide it can be checked."""
    routed = Routed(dict(fields), teams=teams, given=judged.given)
    verdict = judged.verdict
    if verdict.failed:
        logger.warning("run %s: rule %r failed, left to people: %s", run.pk, verdict.failed, verdict.error)
        routed.note["rule_failed"] = {"rule": verdict.failed, "error": verdict.error}
    elif verdict.rule is not None:
        _apply(run, routed, verdict.rule, action_name, policy)
        _changed(routed, f"rule: {verdict.rule.name}", fields)
    if routed.decision is None and "rule_failed" not in routed.note:
        routed.held = judged.held
        if judged.grant_failed:
            routed.note["grant_failed"] = list(judged.grant_failed)
    before = dict(routed.fields)
    routed.fields["assignees"] = delegation.delegated(run, routed.fields, routed.note, policy)
    _changed(routed, "delegation", before)
    before = dict(routed.fields)
    _settle(routed)
    _changed(routed, "contract", before)
    return routed


# An interrupt's fields that make its decision contract, by their name in the event log.
CONTRACT_FIELDS = {
    "team_id": "team",
    "approvals_required": "approvals",
    "assignees": "assignees",
    "requester_may_approve": "requester_may_approve",
    "expires_at": "deadline",
    "default_answer": "default_answer",
    "escalate_to_id": "escalate_to",
}


def _changed(routed: Routed, layer: str, before: dict[str, Any]) -> None:
    """Log what ``layer`` changed of the contract: the fields that differ from ``before``."""
    changed = {}
    for name, said in CONTRACT_FIELDS.items():
        if (value := routed.fields.get(name)) != before.get(name):
            if name in ("team_id", "escalate_to_id") and value is not None:
                value = Team.objects.filter(pk=value).values_list("slug", flat=True).first()
            changed[said] = value.isoformat() if isinstance(value, datetime) else value
    if changed:
        routed.contract.append({"layer": layer, "changed": changed})


def _settle(routed: Routed) -> None:
    """The decision contract's last word on what the layers made of it: a default answer
    applies at the deadline only where one approval by anyone would do. Where more people
    must approve, or named people must, the deadline expires it instead (the event says so):
    a rule requiring two people, or assigning, is never undone by a request's default."""
    fields = routed.fields
    if fields.get("default_answer") is None:
        return
    needs = int(fields.get("approvals_required") or 1)
    if needs > 1 or fields.get("assignees"):
        fields["default_answer"] = None
        why = f"{needs} approvals are required" if needs > 1 else "it is assigned to named people"
        routed.note["default_answer_dropped"] = f"no default answer at the deadline: {why}"


def scoped(grant: Grant, run: Run, who: str) -> bool:
    """Whether ``grant`` is for this run, or for this requester."""
    if grant.run_id is not None:
        return grant.run_id == run.pk
    return bool(grant.requester) and grant.requester == who


def _apply(run: Run, routed: Routed, rule: Compiled, action_name: str, policy: ApprovalPolicy) -> None:
    then, fields = rule.then, routed.fields
    said = {"rule": rule.name, "then": then.describe()}
    if isinstance(then, Approve):
        if not policy.auto_approve:
            routed.note["rule_failed"] = {
                "rule": rule.name,
                "error": f"{action_name} may not be approved automatically (auto_approve=False)",
            }
            return
        answer = then.answer if then.answer is not None else _plain_answer(action_name)
        try:
            if (schema := fields.get("answer_schema")) is not None:  # the pause's own
                if errors := schema_errors(schema, answer):
                    raise ValueError(describe_errors(errors, "answer"))
            elif (act := registry.find(action_name)) is not None:
                answer = act.validate_answer(answer)
        except Exception as exc:  # noqa: BLE001 - a pydantic error: the answer does not fit
            routed.note["rule_failed"] = {"rule": rule.name, "error": f"its answer does not fit: {exc}"[:500]}
            return
        routed.decision, routed.decided_by = ("approve", answer), f"rule: {rule.name}"
    elif isinstance(then, Reject):
        routed.decision, routed.decided_by = ("reject", then.reason), f"rule: {rule.name}"
    elif isinstance(then, RequireApprovals):
        # More people than asked, never fewer: the request's count and the policy's stand.
        fields["approvals_required"] = max(int(fields.get("approvals_required") or 1), then.count)
    elif isinstance(then, AssignTo):
        fields["assignees"] = list(then.users)
    elif isinstance(then, RouteTo):
        team_id = Team.objects.filter(slug=then.team).values_list("pk", flat=True).first()
        if team_id is None:
            routed.note["rule_failed"] = {"rule": rule.name, "error": f"there is no team {then.team!r}"}
            return
        # Decided there as that team decides the action: its policy's assignees, deadline,
        # escalation and approvals, not the first team's.
        override, _, _ = store.team_policy(team_id, action_name)
        theirs = with_override(action_name, override)
        asked = dict(fields)
        fields.update(policy_fields(team_id, action_name, timezone.now(), theirs), team_id=team_id)
        # Routing keeps what was asked: as many people at least, separation of duties if
        # either side wanted it, the earlier deadline, and the request's default answer where
        # that team has none (the contract below decides whether it may apply).
        fields["approvals_required"] = max(
            int(fields.get("approvals_required") or 1), int(asked.get("approvals_required") or 1)
        )
        fields["requester_may_approve"] = bool(fields.get("requester_may_approve", True)) and bool(
            asked.get("requester_may_approve", True)
        )
        deadlines = [at for at in (fields.get("expires_at"), asked.get("expires_at")) if at is not None]
        fields["expires_at"] = min(deadlines) if deadlines else None
        # The request's default only where that team would allow one of its own: no deadline
        # of its own to expire it, rules and grants may approve, one approval by anyone.
        if fields.get("default_answer") is None and (
            theirs.deadline is None and theirs.auto_approve and theirs.approvals <= 1 and not theirs.assignees
        ):
            fields["default_answer"] = asked.get("default_answer")
        elif asked.get("default_answer") is not None and fields.get("default_answer") is None:
            routed.note["default_answer_dropped"] = (
                f"no default answer at the deadline: {then.team} allows none"
            )
    routed.note["rule"] = said


def _plain_answer(action_name: str) -> Any:
    act = registry.find(action_name)
    return dict(PLAIN_APPROVAL) if act is None or act.answer_model is None else {}


def event_detail(routed: Routed, layers: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """What the interrupt's event says of its rules and delegations, and under ``contract``
    what each layer changed of what deciding it requires (``layers``: the policies', from
    policies.policy_layers; then the rule's, delegation's and the contract's own)."""
    detail = dict(routed.note)
    if contract := [*layers, *routed.contract]:
        detail["contract"] = contract
    return detail


__all__ = [
    "Routed",
    "Verdict",
    "evaluate",
    "route",
]
