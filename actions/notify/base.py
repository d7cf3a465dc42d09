"""What every channel shares: the failure a transport reports, and the site's own links."""

from __future__ import annotations

from django.conf import settings

from actions.models import Notification, Preferences, Team

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
    if interrupt is not None and notification.type in ASKS_DECISION and not interrupt.is_pending:
        return f"it was {interrupt.status} meanwhile"
    prefs = Preferences.objects.filter(user=user).first()
    if notification.channel == Notification.Channel.EMAIL and prefs is not None and not prefs.email:
        return "the recipient turned mail off"
    if interrupt is None:
        return ""
    if not Team.objects.filter(pk__in=interrupt.team_ids, members=user).exists():
        return "the recipient is no longer in the interrupt's team"
    if (
        notification.type in ASKS_DECISION
        and interrupt.approvals.filter(user=user, superseded_at=None).exists()
    ):
        return "the recipient has approved it already"
    return ""


def absolute(path: str) -> str:
    """A path of this site as a link from outside it (GRUNDLAG_BASE_URL)."""
    return settings.GRUNDLAG_BASE_URL.rstrip("/") + path
