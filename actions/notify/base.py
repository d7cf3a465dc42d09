"""What every channel shares: the failure a transport reports, why a notification is not sent, and
the site's own links."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from actions.models import (
    DeliveryAttempt,
    Interrupt,
    Membership,
    Notification,
    Preferences,
    Role,
    TeamChannels,
)

logger = logging.getLogger(__name__)

# The events that ask someone anew (a Slack message is posted for them), and those that ask for
# a decision (a mail carries its link): the reminder asks again, in the same place.
ASKS_ANEW = ("interrupt.created", "interrupt.escalated")
ASKS_DECISION = (*ASKS_ANEW, "interrupt.expiring")


class DeliveryFailed(Exception):
    """A channel could not deliver; the attempt is recorded with this and tried again later."""

    def __init__(self, error: str, status_code: int | None = None) -> None:
        super().__init__(error)
        self.status_code = status_code


class NotSent(Exception):
    """Not to be sent: no longer for its recipient (they left the team, turned mail off, were
    disabled, or it was decided meanwhile), or an error that no retry mends (a Slack channel
    that does not exist): recorded, not sent, not retried."""


# Makes a notification of the event being fanned out: (channel, key of its message id, payload,
# and the Notification's other fields: recipient, webhook, digest, next_attempt_at).
Notify = Callable[..., None]


class Transport:
    """A channel, in the module of its own (webhook, email, slack): whom an interrupt's event
    reaches on it, and sending one of its notifications. ``send`` returns the HTTP status code
    (0 where there is none); an error is a DeliveryFailed, tried again later, or a NotSent,
    which no retry mends: recorded, never retried (healthchecks' transports say the same with
    TransportError(permanent=...)). A new channel is a module with its Transport, listed in
    actions.notify.delivery.TRANSPORTS, and a Notification.Channel."""

    channel: str

    def send(self, notification: Notification) -> int:
        raise NotImplementedError

    def to_people(
        self,
        it: Interrupt,
        kind: str,
        body: dict[str, Any],
        notify: Notify,
        routing: TeamChannels,
        people: list[Any],
    ) -> None:
        """An interrupt's event, to the people of its team who hear of it (``people``: those who
        may decide it, or for a decision whoever asked), as the team routes it (``routing``)."""

    def to_mentioned(self, user: Any, body: dict[str, Any], notify: Notify) -> None:
        """A comment that names ``user``, a member of the interrupt's team."""


def preferences(user: Any) -> Preferences:
    """The person's own notification settings (the defaults when they chose none)."""
    try:
        prefs: Preferences = user.grundlag_preferences
    except Preferences.DoesNotExist:
        return Preferences(user=user)
    return prefs


def decided_meanwhile(kind: str, interrupt_status: str) -> str:
    """Why a request to a person for a decision is not to be sent, or "": the interrupt it asks
    about was decided (or expired, or cancelled) since. The first of still_for's reasons that
    needs no query; fan_out and skip_decided tell it as well, before any sender has it."""
    if kind in ASKS_DECISION and interrupt_status != Interrupt.Status.PENDING:
        return f"it was {interrupt_status} meanwhile"
    return ""


def not_sent(why: str, **notification: Any) -> DeliveryAttempt:
    """The attempt that records a notification skipped (``notification`` or
    ``notification_id``), saying why. Not saved."""
    return DeliveryAttempt(ok=False, error=f"not sent: {why}"[:500], **notification)


def still_for(notification: Notification) -> str:
    """Why a person's notification must not be sent now, or "". Its recipients were chosen when
    the event was fanned out; a digest or a retry may send it an hour later."""
    user = notification.recipient
    if user is None:
        return ""
    if not user.is_active:
        return "the recipient's account is disabled"
    interrupt = notification.event.interrupt if notification.event is not None else None
    # What needs no query first: a request for a decision that was made meanwhile.
    if interrupt is not None and (why := decided_meanwhile(notification.type, interrupt.status)):
        return why
    prefs = Preferences.objects.filter(user=user).first()
    if notification.channel == Notification.Channel.EMAIL and prefs is not None and not prefs.email:
        return "the recipient turned mail off"
    if interrupt is None:
        return ""
    roles = Membership.roles_of(user.pk, interrupt.team_ids)
    if not roles:
        return "the recipient is no longer in the interrupt's team"
    if not roles & (Role.DECIDE if notification.type in ASKS_DECISION else Role.WORK):
        return f"the recipient's role ({' and '.join(sorted(roles))}) is not told of it"
    if (
        notification.type in ASKS_DECISION
        and interrupt.approvals.filter(user=user, superseded_at=None).exists()
    ):
        return "the recipient has approved it already"
    return ""


def absolute(path: str) -> str:
    """A path of this site as a link from outside it (GRUNDLAG_BASE_URL)."""
    return settings.GRUNDLAG_BASE_URL.rstrip("/") + path


def send_lease() -> timedelta:
    """How long a claimed notification is left to its sender before it may be sent again."""
    return timedelta(seconds=settings.GRUNDLAG_SEND_LEASE_SECONDS)


@contextlib.contextmanager
def unless_gone(notification: Notification) -> Iterator[None]:
    """Around the transaction that records an attempt: deleting a webhook deletes its
    notifications, one being sent included, and its attempt then refers to nothing (an
    IntegrityError, at the insert or at commit): it goes with them. Any other is raised."""
    try:
        yield
    except IntegrityError:
        if Notification.objects.filter(pk=notification.pk).exists():
            raise
        logger.info("notification %s went with its endpoint while it was being sent", notification.pk)


def skip(notification: Notification, why: str) -> None:
    """Not sent, and not to be: the attempt says why."""
    with unless_gone(notification), transaction.atomic():
        not_sent(why, notification=notification).save()
        Notification.objects.filter(pk=notification.pk, outcome=Notification.Outcome.PENDING).update(
            outcome=Notification.Outcome.SKIPPED
        )
