"""Webhooks: a POST of the event's JSON to the team's endpoint, signed per the Standard Webhooks
spec (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``: HMAC-SHA256 of
``id.timestamp.body`` with the endpoint's ``whsec_`` secret), with the ``standardwebhooks``
package. The id is the notification's, the same on every attempt: a receiver drops a duplicate
by it.

An endpoint must resolve to public addresses only, when it is registered and again at each
delivery (a name may be pointed elsewhere later), unless GRUNDLAG_WEBHOOK_ALLOW_PRIVATE: the
server must not be made to call into its own network. Redirects are not followed."""

from __future__ import annotations

import ipaddress
import json
import socket
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from standardwebhooks import Webhook as Signer

from actions.models import Notification, Webhook


class DeliveryFailed(Exception):
    def __init__(self, error: str, status_code: int | None = None) -> None:
        super().__init__(error)
        self.status_code = status_code


def url_problem(url: str) -> str:
    """Why this URL may not be a webhook endpoint ("" when it may)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the URL must be http:// or https:// with a host"
    if parts.username or parts.password:
        return "the URL must not carry credentials"
    if settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE:
        return ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError, UnicodeError):
        return f"the host {parts.hostname!r} does not resolve"
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        if not address.is_global or address.is_multicast:
            return (
                f"the host {parts.hostname!r} resolves to {address}, a private, loopback or"
                " link-local address (GRUNDLAG_WEBHOOK_ALLOW_PRIVATE=true allows it)"
            )
    return ""


def send(notification: Notification) -> int:
    """POST the notification to its endpoint; the status code. Raises DeliveryFailed."""
    hook = notification.webhook
    assert hook is not None
    if problem := url_problem(hook.url):
        raise DeliveryFailed(f"refused: {problem}")
    body = json.dumps(notification.payload, separators=(",", ":"), default=str)
    now = datetime.now(UTC)
    headers = {
        "content-type": "application/json",
        "user-agent": "Grundlag-Webhooks/1",
        "webhook-id": notification.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Signer(hook.secret).sign(notification.message_id, now, body),
    }
    try:
        response = httpx.post(
            hook.url,
            content=body.encode(),
            headers=headers,
            timeout=settings.GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS,
            follow_redirects=False,
        )
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:500]) from None
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(f"HTTP {response.status_code} {response.reason_phrase}", response.status_code)
    return response.status_code


def create(team_id: int, url: str, events: list[str], by: str) -> Webhook:
    return Webhook.objects.create(team_id=team_id, url=url, events=events, created_by_name=by)
