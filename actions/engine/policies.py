"""What a policy says: the deadline, escalation, approvals and assignees an interrupt gets when
it is created, and who may decide it. (Deadlines and escalations fire in
actions.engine.deadlines.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from actions.core import ApprovalPolicy, registry
from actions.engine import store
from actions.models import Actor, ApiToken, Interrupt, Membership, Policy, Role, Run, Scope, Team

# Who decided an interrupt whose deadline passed (its decided_by_name; the audit says "deadline").
DEADLINE_POLICY = "deadline policy"


def effective_policy(team_id: int, action_name: str) -> ApprovalPolicy:
    """The action's declared policy, unless the team overrides it (admin: Policies)."""
    return with_override(action_name, store.policy_override(team_id, action_name))


def with_override(action_name: str, override: Policy | None) -> ApprovalPolicy:
    """The action's declared policy, as the team's ``override`` changes it."""
    act = registry.find(action_name)
    declared = act.policy if act is not None else ApprovalPolicy()
    if override is None:
        return declared

    def minutes(value: int | None) -> timedelta | None:
        return timedelta(minutes=value) if value else None

    escalates = override.escalate_to is not None and bool(override.escalate_after_minutes)
    return ApprovalPolicy(
        deadline=minutes(override.deadline_minutes),
        default_answer=override.default_answer,
        escalate_after=minutes(override.escalate_after_minutes) if override.escalate_to else None,
        escalate_to=override.escalate_to.slug if escalates and override.escalate_to else None,
        approvals=override.approvals_required or 1,
        assignees=tuple(name.strip() for name in override.assignees.split(",") if name.strip()),
        requester_may_approve=declared.requester_may_approve
        if override.requester_may_approve is None
        else override.requester_may_approve,
        # The team's own rules are TeamRules: what the action declares still applies.
        rules=declared.rules,
        auto_approve=declared.auto_approve,
    )


def as_requested(policy: ApprovalPolicy, requested: dict[str, Any]) -> ApprovalPolicy:
    """The policy with what a pause asks of it (``Pause.policy``: ApprovalPolicy's fields by
    name) added: more approvals than the policy's, never fewer; a deadline sooner than its own,
    never later. (What a pause may ask at all is checked where it is asked: the approval
    driver refuses a default answer or assignees the team's policy does not allow.)"""
    if not requested:
        return policy
    if "approvals" in requested:
        requested = {**requested, "approvals": max(policy.approvals, requested["approvals"])}
    if policy.deadline is not None and requested.get("deadline") is not None:
        requested = {**requested, "deadline": min(policy.deadline, requested["deadline"])}
    return dataclasses.replace(policy, **requested)


def terms(policy: ApprovalPolicy) -> dict[str, Any]:
    """What a policy requires of deciding, in the words of the event log and the API."""
    return {
        "approvals": policy.approvals,
        "assignees": list(policy.assignees),
        "requester_may_approve": policy.requester_may_approve,
        "automatic_approval": policy.auto_approve,
        "deadline_seconds": int(policy.deadline.total_seconds()) if policy.deadline else None,
        "default_answer": policy.default_answer,
        "escalate_to": policy.escalate_to,
    }


_UNSET = terms(ApprovalPolicy())


def policy_layers(
    action_name: str, override: Policy | None, requested: dict[str, Any]
) -> tuple[ApprovalPolicy, list[dict[str, Any]]]:
    """The policy a new pause is decided under (the action's, as the team's ``override`` and
    the pause's ``requested`` change it), and what each of those layers changed, for its
    event: the decision contract's first layers (rules, routing and delegation follow in
    rules.route)."""
    declared = with_override(action_name, None)
    overridden = with_override(action_name, override) if override is not None else declared
    final = as_requested(overridden, requested)
    layers: list[dict[str, Any]] = []
    before = _UNSET
    for layer, policy in (("action", declared), ("team policy", overridden), ("request", final)):
        now = terms(policy)
        if changed := {name: value for name, value in now.items() if before[name] != value}:
            layers.append({"layer": layer, "changed": changed})
        before = now
    return final, layers


def policy_fields(
    team_id: int, action_name: str, now: datetime, policy: ApprovalPolicy | None = None
) -> dict[str, Any]:
    """The fields a new interrupt of the action in the team gets from its policy."""
    policy = policy or effective_policy(team_id, action_name)
    escalate_to = Team.objects.filter(slug=policy.escalate_to).first() if policy.escalate_to else None
    return {
        "expires_at": now + policy.deadline if policy.deadline else None,
        "default_answer": policy.default_answer,
        "escalate_at": now + policy.escalate_after if policy.escalate_after and escalate_to else None,
        "escalate_to_id": escalate_to.pk if escalate_to else None,
        "approvals_required": policy.approvals,
        "assignees": list(policy.assignees),
        "requester_may_approve": policy.requester_may_approve,
    }


def may_decide(by: Actor, interrupt: Interrupt) -> bool:
    """Members of its team (or of the team it escalated to) whose role decides (approvers and
    admins), and among them its assignees if it names any. A token acts for its team, but is
    nobody in particular: it cannot be one of several required approvers, nor a named assignee."""
    if by is None:
        return True  # the engine itself: a deadline policy
    if isinstance(by, ApiToken):
        return (
            by.allows([Scope.INTERRUPTS_DECIDE])
            and by.team_id in interrupt.team_ids
            and not interrupt.assignees
            and interrupt.approvals_required == 1
        )
    if not by.is_authenticated or not Membership.has(by.pk, interrupt.team_ids, Role.DECIDE):
        return False  # a member whose role does not decide (a viewer, an auditor) neither
    return not interrupt.assignees or by.get_username() in interrupt.assignees


SEPARATION_OF_DUTIES = (
    "Separation of duties: whoever started a run may not approve it "
    "(requester_may_approve is off for {action})."
)


SEPARATION_OF_DUTIES_TOKEN = (
    "Separation of duties: an API token is not a person, so it cannot show that someone other "
    "than the requester approves (requester_may_approve is off for {action})."
)


def separation_of_duties(by: Actor, interrupt: Interrupt) -> str:
    """Why ``by`` may not approve ``interrupt`` because they (may have) started its run, or "".
    A token acts for its whole team, whoever started the run: it may not approve at all.
    Rejecting stays open to everyone: it is how a requester withdraws."""
    if interrupt.requester_may_approve or by is None:
        return ""
    if isinstance(by, ApiToken):
        return SEPARATION_OF_DUTIES_TOKEN.format(action=interrupt.action)
    started_by_id = Run.objects.filter(pk=interrupt.run_id).values_list("started_by_id", flat=True).first()
    own = started_by_id is not None and started_by_id == by.pk
    return SEPARATION_OF_DUTIES.format(action=interrupt.action) if own else ""


def why_not(by: Actor, interrupt: Interrupt) -> str:
    """Why ``by`` may not decide ``interrupt`` (when may_decide says so)."""
    if isinstance(by, ApiToken) and not by.allows([Scope.INTERRUPTS_DECIDE]):
        return "This token may not decide: it needs the scope interrupts:decide."
    if refused := role_refusal(by, interrupt.team_ids, Role.DECIDE, "decide this"):
        return refused  # before the assignees: an assignee made viewer is told why
    if interrupt.assignees:
        return f"Only {', '.join(interrupt.assignees)} may decide this."
    if isinstance(by, ApiToken) and interrupt.approvals_required > 1:
        return f"This needs {interrupt.approvals_required} people to approve; an API token is not a person."
    return f"Only members of {interrupt.team} can decide this."


def role_refusal(by: Actor, team_ids: Collection[int], roles: Collection[str], what: str) -> str:
    """Why a member of these teams may not do ``what``: the role it needs, and theirs; "" when
    ``by`` is no member of them at all (or is one in a role that may)."""
    if isinstance(by, ApiToken) or by is None or not by.is_authenticated:
        return ""
    theirs = Membership.roles_of(by.pk, team_ids)
    if not theirs or theirs & set(roles):
        return ""
    return (
        f"To {what} you need the {Role.needed(roles)} role in this team;"
        f" yours is {' and '.join(sorted(theirs))}. A team admin can change it."
    )


def why_not_start(by: Actor, team: Team) -> str:
    """Why a person may not start a run in ``team``, or "": its approvers and admins may (and
    staff); a token, within its scopes, and the engine itself, always."""
    if by is None or isinstance(by, ApiToken) or not by.is_authenticated or getattr(by, "is_staff", False):
        return ""
    if Membership.has(by.pk, [team.pk], Role.DECIDE):
        return ""
    return (
        role_refusal(by, [team.pk], Role.DECIDE, "start a run")
        or f"Only members of {team} can start its runs."
    )


def why_not_cancel(by: Actor, run: Run) -> str:
    """Why ``by`` may not cancel ``run``, or "". Cancelling ends every approval the run waits
    for, so it is a decision too: whoever started the run may withdraw it; anyone else must be
    allowed to decide each interrupt it waits on (a run whose approval is assigned to the CFO is
    not ended by another member of the team). Members of its team whose role decides only,
    either way."""
    if by is None:
        return ""
    if isinstance(by, ApiToken):
        member, started = by.team_id == run.team_id, run.started_by_token_id == by.pk
    else:
        member = by.is_authenticated and Membership.has(by.pk, [run.team_id], Role.DECIDE)
        started = run.started_by_id is not None and run.started_by_id == by.pk
    if not member:
        return role_refusal(by, [run.team_id], Role.DECIDE, "cancel a run") or (
            f"Only members of {run.team} can cancel this run."
        )
    if started:
        return ""
    for interrupt in Interrupt.objects.filter(run_id=run.pk, status=Interrupt.Status.PENDING):
        if not may_decide(by, interrupt):
            return f"Cancelling would end an approval you may not decide: {why_not(by, interrupt)}"
    return ""
