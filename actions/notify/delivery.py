"""Delivering a notification: claimed (so two workers never send it at once), sent by its
channel, the attempt recorded; on failure tried again after 10 s, 20 s, 40 s ... up to an hour
between tries, GRUNDLAG_NOTIFY_MAX_ATTEMPTS in all. A worker that dies mid-send leaves the
claim to run out (GRUNDLAG_SEND_LEASE_SECONDS), and the periodic round sends it again: at most one duplicate,
which carries the same message id.

A webhook endpoint whose deliveries have all failed for GRUNDLAG_WEBHOOK_DISABLE_AFTER_SECONDS
is disabled, with the reason, which the team sees in its webhook list and the admin."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Collection
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from actions import background, tracing
from actions.engine.audit import moment
from actions.models import AuditHead, DeliveryAttempt, Interrupt, Notification, Webhook
from actions.notify import email, process, slack, webhook
from actions.notify.base import (
    ASKS_DECISION,
    DeliveryFailed,
    NotSent,
    Transport,
    decided_meanwhile,
    not_sent,
    send_lease,
    skip,
    still_for,
    unless_gone,
)

logger = logging.getLogger(__name__)

Outcome = Notification.Outcome

# How long a claimed notification is left to its sender before it may be sent again.
FIRST_RETRY_SECONDS = 10
LONGEST_RETRY_SECONDS = 3600

# The channels, each a module of its own: how a notification of each is sent, and (dispatch)
# whom an event reaches on it.
TRANSPORTS: dict[str, Transport] = {
    transport.channel: transport for transport in (webhook.TRANSPORT, email.TRANSPORT, slack.TRANSPORT)
}


def retry_delay(attempts: int) -> timedelta:
    """After the attempts so far failed: 10 s, 20 s, 40 s, ... at most an hour."""
    return timedelta(seconds=min(FIRST_RETRY_SECONDS * 2 ** max(attempts - 1, 0), LONGEST_RETRY_SECONDS))


def _claim(notification_id: int) -> Notification | None:
    now = timezone.now()
    # One statement, atomic as it is: the sender that matched the row has it for the lease.
    claimed = Notification.objects.filter(
        pk=notification_id, outcome=Outcome.PENDING, next_attempt_at__lte=now
    ).update(next_attempt_at=now + send_lease(), attempts=F("attempts") + 1)
    if not claimed:
        return None  # delivered, given up, not due, or being sent
    return Notification.objects.select_related("webhook", "recipient", "event__interrupt").get(
        pk=notification_id
    )


def deliver(notification_id: int) -> bool | None:
    """Try to deliver one notification now, if it is due; whether it was delivered (None: it
    was not due, or another sender has it)."""
    notification = _claim(notification_id)
    if notification is None:
        return None
    # In the trace of the interrupt's pause, whichever process sends it.
    with tracing.span(
        "grundlag.notify", lambda: _attributes(notification), parent=_traceparent(notification)
    ) as span:
        delivered = _send(notification)
        span.set_attribute("grundlag.notification.outcome", "delivered" if delivered else "not delivered")
        return delivered


def _attributes(notification: Notification) -> dict[str, Any]:
    event = notification.event
    return {
        "grundlag.notification.id": notification.pk,
        "grundlag.notification.channel": notification.channel,
        "grundlag.notification.type": notification.type,
        "grundlag.notification.attempt": notification.attempts,
        "grundlag.run.id": event.run_id if event is not None else None,
        "grundlag.interrupt.id": event.interrupt_id if event is not None else None,
    }


def _traceparent(notification: Notification) -> str:
    if not tracing.enabled():
        return ""
    event = notification.event
    interrupt = event.interrupt if event is not None else None
    return (interrupt.traceparent or "") if interrupt is not None else ""


def _send(notification: Notification) -> bool:
    hook = notification.webhook
    began = time.perf_counter()
    status_code: int | None = None
    error = ""
    if hook is None and (why := still_for(notification)):
        skip(notification, why)
        return False
    if hook is not None and hook.disabled_at is not None:
        error = f"the endpoint is disabled: {hook.disabled_reason}"
    else:
        try:
            status_code = TRANSPORTS[notification.channel].send(notification)
        except NotSent as exc:
            skip(notification, str(exc))
            return False
        except DeliveryFailed as exc:
            status_code, error = exc.status_code, str(exc)
        except Exception as exc:  # a channel's own bug must not lose the notification
            logger.exception("notification %s: sending failed", notification.pk)
            error = f"{type(exc).__name__}: {exc}"[:500]
    _record(notification, hook, ok=not error, status_code=status_code, error=error, began=began)
    return not error


def _record(
    notification: Notification,
    hook: Webhook | None,
    *,
    ok: bool,
    status_code: int | None,
    error: str,
    began: float,
) -> None:
    now = timezone.now()
    with unless_gone(notification), transaction.atomic():
        DeliveryAttempt.objects.create(
            notification=notification,
            ok=ok,
            status_code=status_code,
            error=error[:500],
            duration_ms=int((time.perf_counter() - began) * 1000),
        )
        # Only while this attempt still holds it: a sender whose claim ran out (and was taken
        # over) must not overwrite what the next attempt recorded.
        mine = Notification.objects.filter(
            pk=notification.pk, outcome=Outcome.PENDING, attempts=notification.attempts
        )
        if ok:
            mine.update(outcome=Outcome.DELIVERED, delivered_at=now)
            if hook is not None and hook.failing_since is not None:
                Webhook.objects.filter(pk=hook.pk).update(failing_since=None)
            return
        done = notification.attempts >= settings.GRUNDLAG_NOTIFY_MAX_ATTEMPTS or (
            hook is not None and hook.disabled_at is not None
        )
        if done:
            mine.update(outcome=Outcome.FAILED)
        else:
            mine.update(next_attempt_at=now + retry_delay(notification.attempts))
        if hook is not None and hook.disabled_at is None:
            Webhook.objects.filter(pk=hook.pk, failing_since=None).update(failing_since=now)
            limit = now - timedelta(seconds=settings.GRUNDLAG_WEBHOOK_DISABLE_AFTER_SECONDS)
            disabled = Webhook.objects.filter(pk=hook.pk, disabled_at=None, failing_since__lte=limit).update(
                disabled_at=now,
                disabled_reason=f"every delivery since {hook.failing_since or now:%Y-%m-%d %H:%M} UTC failed;"
                f" the last: {error}"[:300],
            )
            if disabled:
                logger.warning("webhook %s disabled: %s", hook.pk, error)


def redeliver(notification_ids: list[int]) -> int:
    """Send these again now (the admin's button): due at once, with attempts to spare."""
    count = Notification.objects.filter(pk__in=notification_ids).update(
        outcome=Outcome.PENDING, next_attempt_at=timezone.now(), delivered_at=None, attempts=0
    )
    for pk in notification_ids:
        transaction.on_commit(functools.partial(schedule, pk))
    return count


def deliver_due(limit: int = 200) -> int:
    """Hand the notifications that are due (new ones missed, retries, claims that ran out) to
    their senders; how many."""
    rows = Notification.objects.filter(outcome=Outcome.PENDING, next_attempt_at__lte=timezone.now())
    due = []
    hooks = set()
    digests: set[int | None] = set()
    for pk, digest, recipient_id, channel in rows.order_by("next_attempt_at", "pk").values_list(
        "pk", "digest", "recipient_id", "channel"
    )[:limit]:
        # A person's digest is sent by one sender, which takes the others due with it: two
        # senders would each take some, and the digest would come in pieces.
        if digest:
            if recipient_id in digests:
                continue
            digests.add(recipient_id)
        due.append(pk)
        if channel == Notification.Channel.WEBHOOK:
            hooks.add(pk)
    schedule_all(due, alone=hooks)
    return len(due)


# Where deliveries run. A Celery worker of the scaled setup runs the task; the embedded
# server's notifier gives them threads of their own (deliver_in, actions.background), never the
# steps' threads: a slow endpoint must not hold up a run.
_background = ThreadPoolExecutor(1, thread_name_prefix="grundlag-dispatch")


def deliver_in(pool: Executor | None) -> None:
    background.threads_for(background.queue_of(background.DELIVER_NOTIFICATIONS), pool)


def delivers_here() -> bool:
    """Whether this process delivers (the embedded notifier's threads), not Celery's workers."""
    return background.runs_in_threads(background.DELIVER_NOTIFICATIONS)


def schedule(notification_id: int) -> None:
    schedule_all([notification_id])


# A Celery task delivers this many of an event's mails or Slack messages, one after another: a
# big team's "new approval" is a few tasks, not one per reviewer. A webhook goes in a task of
# its own, so that an endpoint that is slow to answer holds up no other.
DELIVERY_BATCH = 20


def schedule_all(notification_ids: list[int], *, alone: Collection[int] = ()) -> None:
    """Hand these notifications to their senders; ``alone`` are those (webhooks) a Celery worker
    is to send in a task of their own."""
    if (notifier := process.current) is not None:
        for notification_id in notification_ids:
            notifier.deliver(notification_id)
        return
    # In the notifier's threads each goes alone (they are sent side by side); to Celery's
    # workers, a few to a task.
    here = delivers_here()
    together = [] if here else [pk for pk in notification_ids if pk not in alone]
    batches = [[pk] for pk in notification_ids if here or pk in alone] + [
        together[n : n + DELIVERY_BATCH] for n in range(0, len(together), DELIVERY_BATCH)
    ]
    for batch in batches:
        try:
            background.submit(background.DELIVER_NOTIFICATIONS, batch)
        except RuntimeError:  # the notifier is stopping: pending, the next start sends them
            return
        except Exception:
            logger.warning("notifications %s stay pending: the broker refused them", batch, exc_info=True)


def skip_decided(notification_ids: Collection[int]) -> set[int]:
    """Of these, the requests to people for a decision that was made meanwhile, due and not being
    sent by anyone, are skipped together, as ``deliver`` would have skipped each (``still_for``):
    one transaction for a batch, not a claim, a read and a record for each of a team's mails.
    Which were skipped."""
    decided_statuses = [status for status in Interrupt.Status.values if status != Interrupt.Status.PENDING]
    unwanted = Notification.objects.filter(
        pk__in=list(notification_ids),
        outcome=Outcome.PENDING,
        next_attempt_at__lte=timezone.now(),
        type__in=ASKS_DECISION,
        webhook=None,  # a webhook tells whatever happened (deliver() asks still_for only of people's)
        # An inactive recipient's is skipped for that (still_for's first reason). Slack's posts
        # to a channel (no recipient) still go: they show how it was decided.
        recipient__is_active=True,
        event__interrupt__status__in=decided_statuses,
    ).order_by()
    if not unwanted.exists():  # mostly so: one query, and no transaction
        return set()
    with transaction.atomic():
        # Locked until the outcome is written: a sender skipping the same rows skips others.
        rows = list(
            unwanted.select_for_update(skip_locked=True, of=("self",)).values_list(
                "pk", "type", "event__interrupt__status"
            )
        )
        if not rows:
            return set()
        skipped = {pk for pk, _, _ in rows}
        Notification.objects.filter(pk__in=skipped, outcome=Outcome.PENDING).update(
            outcome=Outcome.SKIPPED, attempts=F("attempts") + 1
        )
        DeliveryAttempt.objects.bulk_create(
            not_sent(decided_meanwhile(kind, status), notification_id=pk) for pk, kind, status in rows
        )
    return skipped


def deliver_each(notification_ids: list[int]) -> None:
    """Deliver these one after another, those no longer wanted first, together. One that fails
    (its claim taken, it is sent again once that runs out: the periodic round) does not stop the
    others."""
    try:
        skipped = skip_decided(notification_ids) if len(notification_ids) > 1 else set()
    except Exception:
        logger.exception("notifications %s: skipping those decided failed; each is tried", notification_ids)
        skipped = set()
    for notification_id in notification_ids:
        if notification_id in skipped:
            continue
        try:
            deliver(notification_id)
        except Exception:
            logger.exception("notification %s: delivery failed; the periodic round retries", notification_id)


def finish_background() -> None:
    """Wait for the work handed to run_in_background (a process that stops)."""
    _background.shutdown(wait=True)


def run_in_background(work: Callable[[], None]) -> None:
    """Run ``work`` in this process's dispatch thread (nothing under eager tasks, as in the
    unit tests, which dispatch when they mean to)."""
    # Asked in this order: whether this process delivers is a dictionary's lookup, whether tasks
    # run where sent a walk through Celery's configuration (the embedded notifier asks at every
    # commit it hears of).
    if not delivers_here() and background.runs_where_sent():
        return
    with contextlib.suppress(RuntimeError):  # stopping: the next periodic round dispatches
        _background.submit(work)


def on_audit_head(sender: Any = None, *, published: AuditHead, **kwargs: Any) -> None:
    """The audit's head_published signal: the webhooks subscribed to audit.head are told."""
    body = {
        "type": "audit.head",
        "timestamp": moment(published.at),
        "data": {"seq": published.seq, "head": published.head, "algorithm": "sha256"},
    }
    hooks = [hook for hook in Webhook.objects.filter(disabled_at=None) if "audit.head" in hook.events]
    made = Notification.objects.bulk_create(
        Notification(
            event=None,
            type="audit.head",
            channel=Notification.Channel.WEBHOOK,
            webhook=hook,
            message_id=f"msg_audit_{published.pk}_w{hook.pk}",
            payload=body,
        )
        for hook in hooks
    )
    for notification in made:
        schedule(notification.pk)
