"""Reaching reviewers and callers outside the dashboard: webhooks, notifications and their
delivery attempts, a team's channels, a person's preferences, Slack messages."""

from __future__ import annotations

import base64
import secrets
from typing import Literal, get_args

from django.conf import settings
from django.db import models
from django.utils import timezone

from actions.models.audit import RunEvent
from actions.models.base import JSONField
from actions.models.runs import Interrupt
from actions.models.teams import Team

# Reaching reviewers and callers outside the dashboard (actions.notify). The run's event log
# is the outbox: an event is written in the transaction of its change (a rolled-back change
# has none), and the dispatcher turns each event worth telling into one Notification per
# recipient, once (Fanout).


def webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


# The event types an endpoint may subscribe to (the API's schema names them).
WebhookEvent = Literal[
    "interrupt.created",
    "interrupt.decided",
    "interrupt.escalated",
    "interrupt.expiring",
    "run.finished",
    # The audit chain's head, published daily (actions.engine.audit).
    "audit.head",
]


class Webhook(models.Model):
    """An endpoint of a calling application, told of its team's events, each request signed
    with the secret (Standard Webhooks)."""

    EVENTS: tuple[str, ...] = get_args(WebhookEvent)

    team = models.ForeignKey(Team, models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    events = JSONField(default=list)
    secret = models.CharField(max_length=100, default=webhook_secret)
    created_at = models.DateTimeField(default=timezone.now)
    created_by_name = models.CharField(max_length=150, blank=True)
    # Since when every delivery has failed (None: the last one succeeded). After
    # GRUNDLAG_WEBHOOK_DISABLE_AFTER_SECONDS of that the endpoint is disabled, saying why.
    failing_since = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.team} -> {self.url}"


class Fanout(models.Model):
    """That an event's notifications were made: each event is fanned out once."""

    event = models.OneToOneField(RunEvent, models.CASCADE, primary_key=True, related_name="fanout")
    at = models.DateTimeField(default=timezone.now)


class Notification(models.Model):
    """One message to one recipient (a webhook endpoint, a user's mail, a team's Slack
    channel) about one event: delivered with retries and backoff, each attempt recorded."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"
        SLACK = "slack"

    class Outcome(models.TextChoices):
        PENDING = "pending"  # to be sent at next_attempt_at (or being sent, until then)
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up: out of attempts, or the endpoint is disabled
        SKIPPED = "skipped"  # no longer for its recipient (left the team, mail off): not sent

    # None: an event of the audit itself (audit.head), which no run logged.
    event = models.ForeignKey(RunEvent, models.CASCADE, null=True, related_name="notifications")
    type = models.CharField(max_length=40)  # interrupt.created, ...
    channel = models.CharField(max_length=10, choices=Channel.choices)
    webhook = models.ForeignKey(Webhook, models.CASCADE, null=True, blank=True, related_name="notifications")
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.CASCADE, null=True, blank=True, related_name="+"
    )
    # The webhook-id header: the same for every attempt, so a receiver drops a duplicate.
    message_id = models.CharField(max_length=64, unique=True)
    # A mail for someone who asked for a digest: sent with the others of the hour, in one mail.
    digest = models.BooleanField(default=False)
    # A mail's personal decision link (actions.web.links) is single use: when it decided.
    link_used_at = models.DateTimeField(null=True, blank=True)
    payload = JSONField(default=dict)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notification_due",
                condition=models.Q(outcome="pending"),
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(channel="webhook", webhook__isnull=False) | ~models.Q(channel="webhook"),
                name="notification_webhook_named",
            )
        ]

    def __str__(self) -> str:
        return f"{self.type} by {self.channel} ({self.outcome})"


class DeliveryAttempt(models.Model):
    """One try at sending a notification: what came back, or what went wrong, and how long."""

    notification = models.ForeignKey(Notification, models.CASCADE, related_name="delivery_attempts")
    at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField(default=False)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {'ok' if self.ok else 'failed'} {self.status_code or self.error}"


# Events a team's reviewers hear of by mail and in Slack, unless the team chooses otherwise.
PERSON_EVENTS = ("interrupt.created", "interrupt.escalated", "interrupt.expiring", "interrupt.decided")


def default_email_events() -> list[str]:
    return list(PERSON_EVENTS)


def default_slack_events() -> list[str]:
    return list(PERSON_EVENTS)


class TeamChannels(models.Model):
    """Which of a team's events reach its people, and where: mail (to those who may decide, or
    the requester for a decision) and a Slack channel."""

    team = models.OneToOneField(Team, models.CASCADE, primary_key=True, related_name="routing")
    email_events = JSONField(
        default=default_email_events,
        blank=True,
        help_text="Of interrupt.created, interrupt.escalated, interrupt.expiring, interrupt.decided",
    )
    slack_channel = models.CharField(
        max_length=80, blank=True, help_text="The Slack channel's id (C0123...); empty: no Slack"
    )
    slack_events = JSONField(default=default_slack_events, blank=True)

    class Meta:
        verbose_name = "team channels"
        verbose_name_plural = "team channels"

    def __str__(self) -> str:
        return f"Channels of {self.team}"


class Preferences(models.Model):
    """A person's own choices: mail or not, one at a time or a digest; their Slack user."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, models.CASCADE, primary_key=True, related_name="grundlag_preferences"
    )
    email = models.BooleanField("mail me about approvals", default=True)
    email_digest = models.BooleanField("one digest mail an hour instead of a mail each", default=False)
    slack_user_id = models.CharField(
        max_length=40,
        blank=True,
        help_text="Their Slack user id (U0123...), when their mail does not match Slack's",
    )

    class Meta:
        verbose_name_plural = "preferences"
        constraints = [
            models.UniqueConstraint(
                fields=["slack_user_id"],
                condition=~models.Q(slack_user_id=""),
                name="preferences_slack_user_once",
            )
        ]

    def __str__(self) -> str:
        return f"Preferences of {self.user}"


class SlackMessage(models.Model):
    """The Slack message that asked about an interrupt, to be updated in place when it is decided."""

    interrupt = models.ForeignKey(Interrupt, models.CASCADE, related_name="slack_messages")
    channel = models.CharField(max_length=40)
    ts = models.CharField(max_length=40)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["interrupt", "channel"], name="slackmessage_once")]

    def __str__(self) -> str:
        return f"{self.channel} {self.ts}"
