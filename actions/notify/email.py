"""Mail, through Django's mail backend (SMTP by EMAIL_HOST and the standard settings; the console
without one). Plain text and HTML: the question, its data rendered readably, and the
recipient's own decision link (actions.notify.links). Someone who chose a digest gets one mail
for the period's notifications, each with its link."""

from __future__ import annotations

import smtplib
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.db.models import F
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from actions.models import DeliveryAttempt, Interrupt, Notification, TeamChannels
from actions.notify import links
from actions.notify.base import (
    ASKS_ANEW,
    ASKS_DECISION,
    DeliveryFailed,
    Notify,
    Transport,
    absolute,
    preferences,
    send_lease,
    skip,
    still_for,
)

VERDICTS = {"approved": "Approved", "rejected": "Rejected", "expired": "Expired", "cancelled": "Cancelled"}


def subject(payload: dict[str, Any]) -> str:
    data, kind = payload.get("data", {}), payload.get("type", "")
    message = " ".join(str(data.get("message", "")).split())[:120]
    if kind == "interrupt.escalated":
        return f"Escalated to your team: {message}"
    if kind == "interrupt.expiring":
        return f"Deadline soon: {message}"
    if kind == "interrupt.commented":
        who = (data.get("comment") or {}).get("by") or "Someone"
        return f"{who} mentioned you: {message}"
    if kind == "interrupt.decided":
        verdict = VERDICTS.get(str(data.get("status")), "Decided")
        who = data.get("decided_by") or "policy"
        return f"{verdict} by {who}: {message}"
    return f"Approval needed: {message}"


def item(notification: Notification) -> dict[str, Any]:
    payload = notification.payload
    data = payload.get("data", {})
    assert notification.event is not None  # a person's notification is of a run's event
    interrupt_id = notification.event.interrupt_id
    return {
        "subject": subject(payload),
        "kind": payload.get("type"),
        "data": data,
        "link": links.url(notification, interrupt_id)
        if payload.get("type") in ASKS_DECISION and interrupt_id
        else "",
    }


def message(notification: Notification, items: list[dict[str, Any]]) -> EmailMultiAlternatives:
    user = notification.recipient
    assert user is not None  # a mail is always to someone
    digest = len(items) > 1
    context = {
        "site_name": settings.SITE_NAME,
        "user": user,
        "items": items,
        "digest": digest,
        "link_days": settings.GRUNDLAG_LINK_DAYS,
        "preferences_url": absolute(reverse("notification-preferences")),
    }
    title = f"{len(items)} approvals for you" if digest else items[0]["subject"]
    mail = EmailMultiAlternatives(
        subject=f"[{settings.SITE_NAME}] {title}",
        body=render_to_string("actions/email/notification.txt", context),
        to=[user.email],
        headers={"X-Grundlag-Notification": notification.message_id, "Auto-Submitted": "auto-generated"},
    )
    mail.attach_alternative(render_to_string("actions/email/notification.html", context), "text/html")
    return mail


def _claim_digest(notification: Notification) -> list[Notification]:
    """The recipient's other digest mails that are due, claimed for this one."""
    now = timezone.now()
    due = Notification.objects.filter(
        recipient_id=notification.recipient_id,
        channel=Notification.Channel.EMAIL,
        digest=True,
        outcome=Notification.Outcome.PENDING,
        next_attempt_at__lte=now,
    ).exclude(pk=notification.pk)
    mine = []
    for other in due.select_related("event").order_by("pk")[:200]:
        taken = Notification.objects.filter(
            pk=other.pk, outcome=Notification.Outcome.PENDING, next_attempt_at__lte=now
        ).update(next_attempt_at=now + send_lease(), attempts=F("attempts") + 1)
        if not taken:
            continue
        if why := still_for(other):
            skip(other, why)
        else:
            mine.append(other)
    return mine


def send(notification: Notification) -> int:
    batch = _claim_digest(notification) if notification.digest else []
    items = [item(n) for n in (notification, *batch)]
    try:
        message(notification, items).send()
    except (smtplib.SMTPException, OSError) as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:500]) from None
    if batch:
        now = timezone.now()
        with transaction.atomic():
            DeliveryAttempt.objects.bulk_create(
                DeliveryAttempt(
                    notification=n, ok=True, status_code=250, error=f"in the digest of {notification.pk}"
                )
                for n in batch
            )
            Notification.objects.filter(pk__in=[n.pk for n in batch]).update(
                outcome=Notification.Outcome.DELIVERED, delivered_at=now
            )
    return 250


def digest_slot() -> Any:
    """When the digest that a mail made now goes in is sent: the end of the current period."""
    period = settings.GRUNDLAG_DIGEST_SECONDS
    now = timezone.now()
    return now + timedelta(seconds=period - now.timestamp() % period)


class EmailTransport(Transport):
    channel = Notification.Channel.EMAIL

    def send(self, notification: Notification) -> int:
        return send(notification)

    def to_people(
        self,
        it: Interrupt,
        kind: str,
        body: dict[str, Any],
        notify: Notify,
        routing: TeamChannels,
        people: list[Any],
    ) -> None:
        if kind not in routing.email_events:
            return
        for user in people:
            prefs = preferences(user)
            if not prefs.email or not user.email:
                continue
            # A digest holds what can wait: not a reminder, nor what expires before it is sent.
            slot = digest_slot()
            digest = (
                prefs.email_digest
                and kind != "interrupt.expiring"
                and not (kind in ASKS_ANEW and it.expires_at is not None and it.expires_at <= slot)
            )
            notify(
                self.channel,
                f"u{user.pk}",
                body,
                recipient=user,
                digest=digest,
                next_attempt_at=slot if digest else timezone.now(),
            )

    def to_mentioned(self, user: Any, body: dict[str, Any], notify: Notify) -> None:
        """A mention is personal: mailed whatever the team routes, as long as the person has
        mail on (in a digest if they chose one)."""
        prefs = preferences(user)
        if not prefs.email or not user.email:
            return
        slot = digest_slot()
        notify(
            self.channel,
            f"u{user.pk}",
            body,
            recipient=user,
            digest=prefs.email_digest,
            next_attempt_at=slot if prefs.email_digest else timezone.now(),
        )


TRANSPORT = EmailTransport()
