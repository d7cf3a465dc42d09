"""Recovery: steps whose worker died, and queued steps whose message was lost.

Safe to run anywhere, any number of times: every change is conditional on what it saw, and a
duplicate message finds nothing to claim."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from actions.engine import store
from actions.engine.journal import atomic, log, log_end, push_run_status
from actions.engine.queue import enqueue, shares
from actions.models import Run, RunEvent

Status = Run.Status


def _requeues_of_this_step(run_id: int) -> int:
    """How often the run's current step was re-queued: since it started or last resumed."""
    progress = (
        RunEvent.objects.filter(run_id=run_id, kind__in=[RunEvent.Kind.STARTED, RunEvent.Kind.RESUMED])
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.REQUEUED, id__gt=progress or 0).count()


def sweep(*, all_unfinished: bool = False) -> int:
    """Re-queue steps whose worker died and re-send queued steps whose message was lost.

    ``all_unfinished`` treats every running step as dead; only a process that knows it is the
    sole worker (the embedded setup, at start) may say so.
    """
    now = timezone.now()
    count = 0
    running = Run.objects.filter(status=Status.RUNNING)
    if not all_unfinished:
        running = running.filter(lease_expires_at__lt=now)
    for run_id, attempt, team_id in running.values_list("pk", "attempt", "team_id"):
        with atomic():
            if _requeues_of_this_step(run_id) >= settings.GRUNDLAG_MAX_STEP_REQUEUES:
                # A step that never gets to record (it kills its worker, or its result cannot be
                # written) would otherwise run again at every lease's end, forever.
                error = (
                    f"the step was re-queued {settings.GRUNDLAG_MAX_STEP_REQUEUES} times without "
                    "recording how it ended (GRUNDLAG_MAX_STEP_REQUEUES); see the server log"
                )
                if Run.objects.filter(pk=run_id, status=Status.RUNNING, attempt=attempt).update(
                    status=Status.FAILED, error=error, finished_at=now, updated_at=now, lease_expires_at=None
                ):
                    log_end(run_id, Status.FAILED, error=error)
                    push_run_status(Run(pk=run_id, team_id=team_id), Status.FAILED)
                continue
            # Conditional on the attempt: a worker that reports back meanwhile keeps its result.
            still_dead = Run.objects.filter(pk=run_id, status=Status.RUNNING, attempt=attempt)
            if not all_unfinished:
                # A heartbeat that renewed the lease since it was read keeps the step its own.
                still_dead = still_dead.filter(lease_expires_at__lt=now)
            requeued = still_dead.update(status=Status.QUEUED, updated_at=now, lease_expires_at=None)
            if requeued:
                log(run_id, RunEvent.Kind.REQUEUED, None, reason="lease expired", attempt=attempt)
                enqueue(run_id)
                count += 1
    # A queued step unclaimed for GRUNDLAG_QUEUED_GRACE_SECONDS is presumed to have lost its
    # message, and is sent again (its updated_at moved on, so at most once per grace).
    grace = now if all_unfinished else now - timedelta(seconds=settings.GRUNDLAG_QUEUED_GRACE_SECONDS)
    # A run waiting its turn (its team at its share of the workers) is left to the hand-on.
    for run_id in store.unclaimed(grace, shares()):
        with transaction.atomic():
            if Run.objects.filter(pk=run_id, status=Status.QUEUED, updated_at__lte=grace).update(
                updated_at=now
            ):
                enqueue(run_id)
                count += 1
    return count
