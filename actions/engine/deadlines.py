"""A policy's timers: deadlines (approve with the default answer, or expire) and escalations.
The beat (or the embedded server's loop) calls apply_policies every few seconds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from actions.core import describe_errors
from actions.engine import journal, store
from actions.engine.decisions import (
    decide,
    finish_with_pending_cancelled,
    resume_if_nothing_pending,
    validate_answer,
)
from actions.engine.errors import AlreadyDecided, Busy, InvalidInput, PayloadTooLarge, retry_on_conflict
from actions.engine.journal import atomic, inbox_changed, log
from actions.engine.policies import DEADLINE_POLICY
from actions.models import Interrupt, Run, RunEvent, Team

logger = logging.getLogger(__name__)


def _fail_expired(run: Run, interrupt: Interrupt) -> None:
    assert interrupt.expires_at is not None
    expired_at = timezone.localtime(interrupt.expires_at).strftime("%Y-%m-%d %H:%M %Z")
    finish_with_pending_cancelled(
        run, Run.Status.FAILED, error=f"the approval expired at {expired_at} without a decision"
    )


def _fail_with(message: str) -> Callable[[Run, Interrupt], None]:
    def fail(run: Run, interrupt: Interrupt) -> None:
        finish_with_pending_cancelled(run, Run.Status.FAILED, error=message)

    return fail


def _apply_deadline(interrupt: Interrupt) -> None:
    """The deadline passed: approve with the policy's default answer, validated now as a
    reviewer's answer would be (the action's answer model may have changed since it was
    declared), or expire the interrupt and fail the run, saying why."""
    if interrupt.default_answer is None:
        decide(
            interrupt,
            Interrupt.Status.EXPIRED,
            None,
            reason="deadline passed",
            then=_fail_expired,
            policy=DEADLINE_POLICY,
        )
        return
    try:
        answer = validate_answer(interrupt, interrupt.default_answer)
    except (InvalidInput, PayloadTooLarge) as exc:
        errors = describe_errors(getattr(exc, "errors", []), "answer")
        message = f"the deadline passed and its default answer is invalid: {exc}" + (
            f" ({errors})" if errors else ""
        )
        logger.error("interrupt %s: %s", interrupt.pk, message)
        decide(
            interrupt,
            Interrupt.Status.EXPIRED,
            None,
            reason=message,
            then=_fail_with(message),
            policy=DEADLINE_POLICY,
        )
        return
    decide(
        interrupt,
        Interrupt.Status.APPROVED,
        None,
        answer=answer,
        then=resume_if_nothing_pending,
        policy=DEADLINE_POLICY,
    )


@retry_on_conflict
def _escalate(interrupt: Interrupt, target: Team, now: datetime) -> bool:
    with atomic():
        # The run first, then the interrupt: the lock order of every change (see decide), so an
        # escalation and a decision of the same interrupt wait for each other, never deadlock.
        store.lock_run(interrupt.run_id)
        escalated = Interrupt.objects.filter(
            pk=interrupt.pk, status=Interrupt.Status.PENDING, escalated_at=None
        ).update(escalated_at=now)
        if not escalated:
            return False
        log(interrupt.run_id, RunEvent.Kind.ESCALATED, None, interrupt, to=target.slug)
        inbox_changed(
            "escalated", interrupt, before=[interrupt.team_id], after=[interrupt.team_id, target.pk]
        )
    return True


def apply_policies(now: datetime | None = None) -> int:
    """Fire due deadlines and escalations (how many), and remind of near deadlines. Each is a
    conditional change on a pending interrupt, so it happens once, and a reviewer deciding at
    the same moment either wins (the policy then does nothing) or is told the policy decided
    first."""
    now = now or timezone.now()
    count = 0
    for interrupt in Interrupt.objects.filter(status=Interrupt.Status.PENDING, expires_at__lte=now):
        try:
            _apply_deadline(interrupt)
            count += 1
        except AlreadyDecided:
            pass  # a reviewer was first
        except Busy:
            logger.warning("deadline of interrupt %s met conflicts; the next round retries it", interrupt.pk)
        except Exception:
            # One interrupt's failure must not stop every team's deadlines behind it.
            logger.exception("deadline of interrupt %s failed; the next round tries it again", interrupt.pk)
    due = Interrupt.objects.filter(
        status=Interrupt.Status.PENDING, escalate_at__lte=now, escalated_at=None, escalate_to__isnull=False
    ).select_related("escalate_to")
    for interrupt in due:
        target = interrupt.escalate_to
        assert target is not None
        try:
            if _escalate(interrupt, target, now):
                count += 1
        except Busy:
            logger.warning(
                "escalation of interrupt %s met conflicts; the next round retries it", interrupt.pk
            )
    remind(now)  # not counted: it decides nothing
    return count


def remind(now: datetime) -> int:
    """Remind the reviewers of interrupts whose deadline is near (interrupt.expiring), once:
    GRUNDLAG_REMIND_BEFORE_SECONDS before it, or halfway for a deadline shorter than twice
    that (a ten-minute deadline is not announced as expiring when it is made)."""
    lead = timedelta(seconds=settings.GRUNDLAG_REMIND_BEFORE_SECONDS)
    near = Interrupt.objects.filter(
        status=Interrupt.Status.PENDING, expires_at__gt=now, expires_at__lte=now + lead, reminded_at=None
    ).only("id", "run_id", "created_at", "expires_at")
    count = 0
    reminded_runs: set[int] = set()
    for interrupt in near:
        assert interrupt.expires_at is not None
        if interrupt.expires_at - now > (interrupt.expires_at - interrupt.created_at) / 2:
            continue
        with atomic():
            reminded = Interrupt.objects.filter(
                pk=interrupt.pk, status=Interrupt.Status.PENDING, reminded_at=None
            ).update(reminded_at=now)
            if reminded:
                log(
                    interrupt.run_id,
                    RunEvent.Kind.EXPIRING,
                    None,
                    interrupt,
                    expires_at=interrupt.expires_at.isoformat(),
                )
                reminded_runs.add(interrupt.run_id)
                count += 1
    if count:
        journal.reminded.send(Interrupt, runs=reminded_runs)
    return count
