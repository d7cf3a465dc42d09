"""Time away: a person's delegate decides in their place while they are away (set_away), and
what is assigned to them meanwhile goes to whoever stands in for them (delegated)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from actions.core import (
    ApprovalPolicy,
)
from actions.engine import store
from actions.engine.errors import retry_on_conflict
from actions.engine.journal import atomic, inbox_changed, log
from actions.models import Delegation, Interrupt, Membership, Role, Run, RunEvent, Team

MAX_DELEGATION_HOPS = 5


def delegated(run: Run, fields: dict[str, Any], note: dict[str, Any], policy: ApprovalPolicy) -> list[str]:
    """The assignees, with those away replaced by their delegates. Not when the delegate is
    already one of them (one person would count twice), is not in the team that decides it,
    or started the run while the requester may not approve it: then the assignee keeps it."""
    assignees: list[str] = list(fields.get("assignees") or [])
    if not assignees:
        return assignees
    now = timezone.now()
    away = _away(now)
    if not away:
        return assignees
    team_id = fields.get("team_id", run.team_id)
    members = set(
        Membership.objects.filter(team_id=team_id, role__in=Role.DECIDE).values_list(
            "user__username", flat=True
        )
    )
    may_approve_own = fields.get("requester_may_approve", policy.requester_may_approve)
    result, moved, kept = [], {}, {}
    for name in assignees:
        delegate = _follow(name, away)
        if delegate == name:
            result.append(name)
            continue
        why = ""
        if delegate in assignees or delegate in result:
            why = f"{delegate} is already one of its approvers"
        elif delegate not in members:
            why = f"{delegate} is not an approver or admin of the team that decides it"
        elif not may_approve_own and run.started_by is not None and run.started_by.get_username() == delegate:
            why = f"{delegate} started the run"
        if why:
            result.append(name)
            kept[name] = why
        else:
            result.append(delegate)
            moved[name] = delegate
    if moved:
        note["delegated"] = moved
    if kept:
        note["not_delegated"] = kept
    return result


def _away(now: datetime) -> dict[str, str]:
    """username -> delegate's username, for everyone away now."""
    rows = Delegation.objects.filter(starts_at__lte=now, ends_at__gt=now).values_list(
        "user__username", "delegate__username"
    )
    return dict(rows)


def _follow(name: str, away: dict[str, str]) -> str:
    seen = [name]
    while name in away and len(seen) <= MAX_DELEGATION_HOPS:
        name = away[name]
        if name in seen:
            return seen[0]  # a cycle: no one to hand it to
        seen.append(name)
    return name


def set_away(user: Any, delegate: Any, starts_at: datetime, ends_at: datetime) -> Delegation:
    """Out of office from ``starts_at`` to ``ends_at``, with ``delegate`` deciding what is
    assigned to ``user``. Starting now, what is pending for ``user`` moves too. ValueError says
    why not (themself, no shared team, an end before the start)."""
    if delegate.pk == user.pk:
        raise ValueError("choose someone else as your delegate")
    if ends_at <= starts_at:
        raise ValueError("the end must come after the start")
    if ends_at <= timezone.now():
        raise ValueError("the end is in the past")
    if (
        not Team.where(user, Role.DECIDE)
        .filter(pk__in=Team.where(delegate, Role.DECIDE).values("pk"))
        .exists()
    ):
        name = delegate.get_username()
        raise ValueError(f"{name} is not an approver or admin in any team where you decide")
    return _set_away(user, delegate, starts_at, ends_at)


@retry_on_conflict
def _set_away(user: Any, delegate: Any, starts_at: datetime, ends_at: datetime) -> Delegation:
    name, to = user.get_username(), delegate.get_username()
    with atomic():
        made = Delegation.objects.create(user=user, delegate=delegate, starts_at=starts_at, ends_at=ends_at)
        if starts_at > timezone.now():
            return made
        # As JSON text (SQLite has no JSON containment); each is read again under its run's
        # lock (the lock order: run, then interrupt), and the exact test is made then.
        waiting = Interrupt.objects.filter(status=Interrupt.Status.PENDING, assignees__icontains=f'"{name}"')
        for run_id, interrupt_id in sorted(waiting.values_list("run_id", "pk")):
            store.lock_run(run_id)
            it = Interrupt.objects.get(pk=interrupt_id)
            if not it.is_pending or name not in (it.assignees or []) or to in it.assignees:
                continue
            if not Membership.has(delegate.pk, it.team_ids, Role.DECIDE):
                continue
            if (
                not it.requester_may_approve
                and Run.objects.filter(pk=it.run_id, started_by=delegate).exists()
            ):
                continue
            if any(approval.user_id in (user.pk, delegate.pk) for approval in store.counted_approvals(it)):
                continue  # one of them approved already: the delegate would be a second approval
            it.assignees = [to if each == name else each for each in it.assignees]
            Interrupt.objects.filter(pk=it.pk, status=Interrupt.Status.PENDING).update(assignees=it.assignees)
            log(it.run_id, RunEvent.Kind.ASSIGNED, user, it, seq=it.seq, delegated={name: to})
            inbox_changed("approval", it, before=it.team_ids, after=it.team_ids)
    return made


def end_away(delegation: Delegation) -> None:
    """Back: new interrupts are assigned to the user again (those moved stay with the
    delegate). An absence not yet begun is deleted."""
    now = timezone.now()
    if delegation.starts_at > now:
        Delegation.objects.filter(pk=delegation.pk).delete()
    elif delegation.ends_at > now:
        ended = max(now, delegation.starts_at + timedelta(microseconds=1))
        Delegation.objects.filter(pk=delegation.pk).update(ends_at=ended)
