"""Standing grants: given with an approval ("the same, for an hour", for the rest of the run,
until revoked), and the live grant that approves a new interrupt as its giver would."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from actions.conditions import (
    ConditionError,
)
from actions.core import (
    ApprovalPolicy,
    registry,
)
from actions.engine import rules
from actions.engine.driving import driver_for
from actions.engine.errors import InvalidInput, NotAllowed
from actions.engine.policies import may_decide, role_refusal, separation_of_duties
from actions.engine.rules import (
    Routed,
    arguments_key,
    requester_key,
    requester_name,
    rules_changed,
    scoped,
    team_set,
)
from actions.engine.schemas import schema_errors
from actions.models import Grant, Interrupt, Membership, Role, Run


def grant_for(run: Run, interrupt: Interrupt, routed: Routed, policy: ApprovalPolicy) -> Grant | None:
    """The live grant that approves ``interrupt`` (inserted, not yet decided), if any: same
    team, action and scope, and its giver could approve it now."""
    if not policy.auto_approve or why_no_grant(interrupt):
        return None
    same = interrupt.team_id == run.team_id and routed.teams is not None
    teams = routed.teams if same and routed.teams is not None else team_set(interrupt.team_id)
    if not teams.grants:
        return None
    now = timezone.now()
    key, who = "", requester_key(run)
    for grant, program in teams.grants:
        if grant.action != interrupt.action or not grant.is_live(now) or not scoped(grant, run, who):
            continue
        if not grant.arguments_sha256 and program is None:
            continue
        if grant.arguments_sha256:
            key = key or arguments_key(run, interrupt)
            if grant.arguments_sha256 != key:
                continue
        # A service's question's grant carries both: the same question, where its condition holds.
        # Its condition was judged before the transaction (``judge``, the routed-to team's
        # too): none runs under the write lock. One given or changed since covers nothing.
        if program is not None and not routed.held.get(grant.pk, False):
            continue
        # An answer that does not fit the pause's own schema approves nothing (it is people's).
        if interrupt.answer_schema is not None and schema_errors(interrupt.answer_schema, grant.answer):
            continue
        # The giver as they are now (deactivated, or out of the team: the grant is void)...
        if grant.granted_by_id is None:
            continue
        giver = get_user_model().objects.filter(pk=grant.granted_by_id, is_active=True).first()
        if giver is None or not may_decide(giver, interrupt) or separation_of_duties(giver, interrupt):
            continue
        # ...and the grant as it is now: revoked or expired a moment ago, it approves nothing.
        used = Grant.objects.filter(pk=grant.pk, revoked_at=None).filter(
            Q(expires_at=None) | Q(expires_at__gt=now)
        )
        if used.update(uses=F("uses") + 1, last_used_at=now):
            return grant
    return None


# How long a grant lasts: what the decision form offers, and for how long (None: until its
# run ends, or until revoked).
GRANT_LASTING: dict[str, tuple[str, timedelta | None]] = {
    "hour": ("For 1 hour", timedelta(hours=1)),
    "run": ("For the rest of this run", None),
    "revoked": ("Until revoked", None),
}


def why_no_grant(interrupt: Interrupt) -> str:
    """Why approving ``interrupt`` cannot come with a standing grant, or "": a grant is one
    person's approval of an action that may be approved automatically."""
    if not _approves_automatically(interrupt):
        return f"{interrupt.action} may not be approved automatically, so it takes no grant"
    if interrupt.approvals_required != 1:
        return "a grant is one person's approval, and this needs several"
    return ""


def _approves_automatically(interrupt: Interrupt) -> bool:
    """As its action's policy says, or, for a call that is no registered action, its driver."""
    if (act := registry.find(interrupt.action)) is not None:
        return act.policy.auto_approve
    run = Run.objects.only("consumer", "driver_state").get(pk=interrupt.run_id)
    return driver_for(run.consumer).approves_automatically(run)


class GrantRefused(InvalidInput):
    """A grant that cannot be given: nothing is decided with it."""

    def __init__(self, message: str) -> None:
        super().__init__(message, [{"loc": ["grant"], "msg": message}])


def give_grant(
    interrupt: Interrupt, by: Any, *, lasting: str, condition: str = "", answer: Any = None
) -> Grant:
    """A grant from the approval ``by`` makes of ``interrupt`` (in its transaction: see
    decisions.resume's ``also``): for an hour, the rest of this run, or until revoked; for the
    same arguments, or for arguments where ``condition`` holds; for the same requester (or this
    run). GrantRefused says why not."""
    if lasting not in GRANT_LASTING:
        raise GrantRefused("say how long the grant lasts: an hour, this run, or until revoked")
    if why := why_no_grant(interrupt):
        raise GrantRefused(why)
    run = Run.objects.get(pk=interrupt.run_id)
    who = requester_key(run)
    if lasting != "run" and not who:
        raise GrantRefused("this run has no requester to scope the grant to: grant it for this run")
    if condition:
        try:
            rules.compile(condition)
        except ConditionError as exc:
            raise GrantRefused(f"the condition is not one a grant can use: {exc}") from None
    lasts = GRANT_LASTING[lasting][1]
    return Grant.objects.create(
        team_id=interrupt.team_id,
        action=interrupt.action,
        granted_by=by,
        granted_by_name=by.get_username(),
        source=interrupt,
        answer=answer,
        # For arguments where the condition holds; a service's question only for the same
        # question, condition or not (its "arguments" are the question).
        arguments_sha256=""
        if condition and run.consumer != Run.Consumer.APPROVAL
        else arguments_key(run, interrupt),
        condition=condition,
        requester="" if lasting == "run" else who,
        requester_name="" if lasting == "run" else requester_name(run),
        run=run if lasting == "run" else None,
        expires_at=timezone.now() + lasts if lasts is not None else None,
    )


def revoke_grant(grant: Grant, by: Any) -> bool:
    """Revoke at once (a use is conditional on the row: no process applies it after this
    commits, whatever it has cached); False when it was revoked already. A person revokes one
    of a team where they decide (or as staff): stopping a grant is never risky, but it is a
    decider's call, not a viewer's or an auditor's. The engine's own (``by`` no user) may."""
    person = getattr(by, "is_authenticated", False) and not by.is_staff
    if person and not Membership.has(by.pk, [grant.team_id], Role.DECIDE):
        raise NotAllowed(
            role_refusal(by, [grant.team_id], Role.DECIDE, "revoke a grant")
            or "Only the team's approvers and admins can revoke its grants."
        )
    with transaction.atomic():
        done = Grant.objects.filter(pk=grant.pk, revoked_at=None).update(
            revoked_at=timezone.now(), revoked_by_name=by.get_username()
        )
        if done:
            rules_changed(grant.team_id)
    return bool(done)
