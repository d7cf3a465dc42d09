"""Webhooks: a POST of the event's JSON to the team's endpoint, signed per the Standard Webhooks
spec (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``: HMAC-SHA256 of
``id.timestamp.body`` with the endpoint's ``whsec_`` secret), with the ``standardwebhooks``
package. The id is the notification's, the same on every attempt: a receiver drops a duplicate
by it.

An endpoint must resolve to public addresses only, when it is registered and again at each
delivery (a name may be pointed elsewhere later), unless GRUNDLAG_WEBHOOK_ALLOW_PRIVATE: the
server must not be made to call into its own network. Redirects are not followed."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
from django.conf import settings
from standardwebhooks import Webhook as Signer

from actions.engine.outbound import PRIVATE, pinned, resolve, url_problem
from actions.models import Notification
from actions.notify.base import DeliveryFailed, Transport

__all__ = ["PRIVATE", "WebhookTransport", "send", "url_problem"]


def send(notification: Notification) -> int:
    """POST the notification to its endpoint; the status code. Raises DeliveryFailed.

    The host is resolved and checked here, and the request goes to the address checked (the
    Host header and TLS's server name stay the host's): a name that points elsewhere by the
    time of the connection (DNS rebinding) cannot lead it into a private network. No proxy
    from the environment is used, and no redirect followed; the response's body is not read."""
    hook = notification.webhook
    assert hook is not None
    problem, addresses = resolve(hook.url)
    if problem:
        raise DeliveryFailed(f"refused: {problem}")
    url, host, extensions = pinned(hook.url, addresses[0])
    body = json.dumps(notification.payload, separators=(",", ":"), default=str)
    now = datetime.now(UTC)
    headers = {
        "host": host,
        "content-type": "application/json",
        "user-agent": "Grundlag-Webhooks/1",
        "webhook-id": notification.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Signer(hook.secret).sign(notification.message_id, now, body),
    }
    try:
        timeout = settings.GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS
        with (
            httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", url, content=body.encode(), headers=headers, extensions=extensions) as sent,
        ):
            status_code, reason = sent.status_code, sent.reason_phrase
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:500]) from None
    if not 200 <= status_code < 300:
        raise DeliveryFailed(f"HTTP {status_code} {reason}", status_code)
    return status_code


class WebhookTransport(Transport):
    """An endpoint hears of its team's events by subscription (actions.notify.dispatch), not as
    a person: it has no share of an interrupt's people."""

    channel = Notification.Channel.WEBHOOK

    def send(self, notification: Notification) -> int:
        return send(notification)


TRANSPORT = WebhookTransport()
