"""Celery tasks. They take ids, never objects, and every one is safe to run twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from actions import engine, notify
from actions.background import DELIVER_NOTIFICATIONS, DISPATCH, QUEUED_AT, RUN_STEP
from actions.engine import audit, idempotency, store
from actions.notify.delivery import deliver_each


# A step that could not reach the database (restarting, or its pool still reconnecting) is
# sent again a moment later, and runs once the database answers. One that failed after its
# claim is claimed by nobody until its lease runs out, as after a crash (the sweeper).
@shared_task(
    name=RUN_STEP,
    bind=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=30,
)
def run_step(self: Any, run_id: int) -> None:
    request = self.request
    # A worker sees a message's headers as the request's attributes; Task.apply, as its headers.
    queued_at = getattr(request, QUEUED_AT, None) or (getattr(request, "headers", None) or {}).get(QUEUED_AT)
    try:
        sent = float(queued_at) if queued_at is not None else None
    except (TypeError, ValueError):
        sent = None  # not ours to trust: the figure goes without it
    engine.execute_step(run_id, sent)


@shared_task(name="actions.tasks.sweep")
def sweep() -> int:
    return engine.sweep()


@shared_task(name="actions.tasks.apply_policies")
def apply_policies() -> int:
    idempotency.prune()
    try:
        return engine.apply_policies()
    finally:
        store.refresh_statistics()  # after the deadlines: it never stops them


@shared_task(name=DISPATCH)
def dispatch_events(run_ids: list[int] | None = None) -> int:
    """Fan out those runs' new events (None: every recent event not yet told)."""
    return notify.dispatch(run_ids)


@shared_task(name="actions.tasks.deliver_notification")
def deliver_notification(notification_id: int) -> None:
    """One notification (what a sender of an earlier version queued; see deliver_notifications)."""
    notify.deliver(notification_id)


@shared_task(name=DELIVER_NOTIFICATIONS)
def deliver_notifications(notification_ids: list[int]) -> None:
    """Several notifications, one after another (an event's mails or Slack messages). One that
    fails is left to its retry, and the others are still sent."""
    deliver_each(notification_ids)


@shared_task(name="actions.tasks.notify")
def notify_round() -> int:
    """The periodic round: fan out what no commit's dispatch did, send what is due."""
    return notify.periodic_round()


@shared_task(name="actions.tasks.audit_daily")
def audit_daily() -> None:
    """Publish the audit chain's head, and verify the chains, once a day (beat asks hourly)."""
    audit.daily()
