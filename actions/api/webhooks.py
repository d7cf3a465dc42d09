"""Webhooks: the token's team's endpoints, told of its events (actions.notify.webhook)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Schema, Status
from ninja.errors import HttpError
from pydantic import Field

from actions import engine
from actions.api.base import Error, In, needs, token_of
from actions.models import Scope, Webhook, WebhookEvent, actor_name
from actions.notify import webhook

router = Router()


# Webhooks: the token's team's endpoints, told of its events (actions.notify.webhook).

# Each event is one request per endpoint: a cap keeps a team from turning the server into an
# amplifier, and the other teams' deliveries from waiting behind its own.
MAX_WEBHOOKS_PER_TEAM = 10


class WebhookIn(In):
    url: str = Field(
        min_length=1,
        max_length=2000,
        description="An http or https URL whose host resolves to public addresses only (unless the "
        "site sets GRUNDLAG_WEBHOOK_ALLOW_PRIVATE); checked again at each delivery",
        json_schema_extra={"format": "uri", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"},
    )
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(Webhook.EVENTS))


class WebhookOut(Schema):
    id: int
    url: str
    events: list[str]
    created_at: datetime
    disabled_at: datetime | None = Field(description="Set when every delivery failed for a day")
    disabled_reason: str
    failing_since: datetime | None


class WebhookCreatedOut(WebhookOut):
    secret: str = Field(description="whsec_...: verifies the signatures; shown only now")


def webhook_out(hook: Webhook) -> dict[str, Any]:
    return {
        "id": hook.pk,
        "url": hook.url,
        "events": hook.events,
        "created_at": hook.created_at,
        "disabled_at": hook.disabled_at,
        "disabled_reason": hook.disabled_reason,
        "failing_since": hook.failing_since,
    }


@router.post(
    "/webhooks",
    response={201: WebhookCreatedOut, 422: Error},
    tags=["webhooks"],
    auth=needs(Scope.WEBHOOKS_WRITE),
)
def create_webhook(request: HttpRequest, payload: WebhookIn) -> Status[dict[str, Any]]:
    """Register an endpoint for the team's events. Each request it gets is signed per the
    Standard Webhooks spec with the `secret` in this response, which is not shown again."""
    token = token_of(request)
    if problem := webhook.url_problem(payload.url):
        raise HttpError(422, f"url: {problem}")
    if Webhook.objects.filter(team=token.team_id).count() >= MAX_WEBHOOKS_PER_TEAM:
        raise HttpError(422, f"a team has at most {MAX_WEBHOOKS_PER_TEAM} webhooks; delete one first")
    events = sorted(set(payload.events))
    with transaction.atomic():
        hook = Webhook.objects.create(
            team_id=token.team_id, url=payload.url, events=events, created_by_name=actor_name(token)
        )
        engine.idempotency.record(None)
    return Status(201, {**webhook_out(hook), "secret": hook.secret})


@router.get("/webhooks", response=list[WebhookOut], tags=["webhooks"], auth=needs(Scope.WEBHOOKS_WRITE))
def list_webhooks(request: HttpRequest) -> list[dict[str, Any]]:
    return [webhook_out(hook) for hook in Webhook.objects.filter(team=token_of(request).team_id)]


@router.delete(
    "/webhooks/{webhook_id}",
    response={204: None, 404: Error},
    tags=["webhooks"],
    auth=needs(Scope.WEBHOOKS_WRITE),
)
def delete_webhook(request: HttpRequest, webhook_id: int) -> Status[None]:
    deleted, _ = Webhook.objects.filter(team=token_of(request).team_id, pk=webhook_id).delete()
    if not deleted:
        raise HttpError(404, "no such webhook")
    return Status(204, None)
