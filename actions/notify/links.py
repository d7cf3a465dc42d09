"""A mail's personal decision link: signed (Django's signing, with SECRET_KEY), bound to its
recipient and its interrupt, single use, and expiring at the interrupt's deadline or after
GRUNDLAG_LINK_DAYS, whichever is first. Whoever holds the mail may decide as its recipient, once:
like a password-reset mail, it must not be forwarded. The token names the notification that
carried it, which records its use; nothing secret is stored. Opened by actions.web.links."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core import signing
from django.urls import reverse

from actions.models import Interrupt, Notification
from actions.notify.base import absolute

SALT = "grundlag.notify.decision-link"


def token(notification: Notification, interrupt_id: int) -> str:
    return signing.dumps(
        [notification.pk, notification.recipient_id, interrupt_id], salt=SALT, compress=False
    )


def url(notification: Notification, interrupt_id: int) -> str:
    return absolute(reverse("decision-link", args=[token(notification, interrupt_id)]))


def expires_at(notification: Notification, interrupt: Interrupt) -> datetime:
    """The deadline, or GRUNDLAG_LINK_DAYS after the mail if that comes first."""
    latest = notification.created_at + timedelta(days=settings.GRUNDLAG_LINK_DAYS)
    return min(interrupt.expires_at, latest) if interrupt.expires_at else latest


@dataclass
class Opened:
    notification: Notification
    interrupt: Interrupt


class Invalid(Exception):
    """Not a link this site made for anyone: cut short, changed, or its mail is gone."""


def open_link(value: str) -> Opened:
    """The notification and interrupt a token names, or Invalid. Whether it is used, expired or
    decided is the caller's to tell, in that order of interest."""
    try:
        notification_id, user_id, interrupt_id = signing.loads(value, salt=SALT)
    except (signing.BadSignature, ValueError, TypeError):
        raise Invalid from None
    notification = (
        Notification.objects.select_related("recipient", "event")
        .filter(pk=notification_id, recipient_id=user_id, channel=Notification.Channel.EMAIL)
        .first()
    )
    if notification is None or notification.event is None or notification.event.interrupt_id != interrupt_id:
        raise Invalid
    interrupt = Interrupt.objects.select_related("run", "team", "escalate_to").get(pk=interrupt_id)
    return Opened(notification, interrupt)
