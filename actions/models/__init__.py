"""The tables, one module per concern; every model is importable from here (actions.models.X),
as migrations and the rest of the project name them."""

from __future__ import annotations

from actions.models.audit import (
    GENESIS,
    AuditAnchor,
    AuditChain,
    AuditCheck,
    AuditExport,
    AuditHead,
    RunEvent,
    RunEventQuerySet,
)
from actions.models.base import (
    TOO_DEEP,
    JSONField,
    where_set,
)
from actions.models.notify import (
    PERSON_EVENTS,
    DeliveryAttempt,
    Fanout,
    Notification,
    Preferences,
    SlackMessage,
    TeamChannels,
    Webhook,
    WebhookEvent,
    default_email_events,
    default_slack_events,
    webhook_secret,
)
from actions.models.rules import (
    Delegation,
    Grant,
    Policy,
    TeamRule,
)
from actions.models.runs import (
    Approval,
    Comment,
    Interrupt,
    Run,
)
from actions.models.teams import (
    Actor,
    ApiToken,
    IdempotencyKey,
    InboxStream,
    Team,
    actor_name,
    actor_user,
    hash_token,
)

__all__ = [
    "Actor",
    "actor_name",
    "actor_user",
    "ApiToken",
    "Approval",
    "AuditAnchor",
    "AuditChain",
    "AuditCheck",
    "AuditExport",
    "AuditHead",
    "Comment",
    "default_email_events",
    "default_slack_events",
    "Delegation",
    "DeliveryAttempt",
    "Fanout",
    "GENESIS",
    "Grant",
    "hash_token",
    "IdempotencyKey",
    "InboxStream",
    "Interrupt",
    "JSONField",
    "Notification",
    "PERSON_EVENTS",
    "Policy",
    "Preferences",
    "Run",
    "RunEvent",
    "RunEventQuerySet",
    "SlackMessage",
    "Team",
    "TeamChannels",
    "TeamRule",
    "TOO_DEEP",
    "Webhook",
    "webhook_secret",
    "WebhookEvent",
    "where_set",
]
