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

from actions.models import Notification
from actions.notify.base import DeliveryFailed

# Public by Python's count, yet a way back into a private network: NAT64 and 6to4 embed an
# IPv4 address that a gateway may route to.
_TUNNELS = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("2002::/16"))
PRIVATE = (
    "resolves to a private, loopback or link-local address (GRUNDLAG_WEBHOOK_ALLOW_PRIVATE=true allows it)"
)


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in _TUNNELS):
        return False
    return address.is_global and not address.is_multicast


def _resolve(url: str) -> tuple[str, list[str]]:
    """(why the URL may not be an endpoint, or ""; the addresses it may be sent to)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "the URL must be http:// or https:// with a host", []
    if parts.username or parts.password:
        return "the URL must not carry credentials", []
    if not parts.hostname.isascii():
        # Looked up here by one IDNA, sent by httpx with another: write it as xn--.
        return "the host must be ASCII (write an internationalised name as xn--...)", []
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError, UnicodeError):
        return f"the host {parts.hostname!r} does not resolve", []
    addresses = list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in infos))
    if not settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE and not all(
        _public(ipaddress.ip_address(address)) for address in addresses
    ):
        return f"the host {parts.hostname!r} {PRIVATE}", []
    return "", addresses


def url_problem(url: str) -> str:
    """Why this URL may not be a webhook endpoint ("" when it may)."""
    return _resolve(url)[0]


def send(notification: Notification) -> int:
    """POST the notification to its endpoint; the status code. Raises DeliveryFailed.

    The host is resolved and checked here, and the request goes to the address checked (the
    Host header and TLS's server name stay the host's): a name that points elsewhere by the
    time of the connection (DNS rebinding) cannot lead it into a private network. No proxy
    from the environment is used, and no redirect followed; the response's body is not read."""
    hook = notification.webhook
    assert hook is not None
    problem, addresses = _resolve(hook.url)
    if problem:
        raise DeliveryFailed(f"refused: {problem}")
    parts = urlsplit(hook.url)
    host = parts.hostname or ""
    address = addresses[0]
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    pinned = parts._replace(netloc=netloc).geturl()
    body = json.dumps(notification.payload, separators=(",", ":"), default=str)
    now = datetime.now(UTC)
    headers = {
        "host": parts.netloc.rpartition("@")[2],
        "content-type": "application/json",
        "user-agent": "Grundlag-Webhooks/1",
        "webhook-id": notification.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Signer(hook.secret).sign(notification.message_id, now, body),
    }
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    try:
        timeout = settings.GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS
        with (
            httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client,
            client.stream(
                "POST", pinned, content=body.encode(), headers=headers, extensions=extensions
            ) as sent,
        ):
            status_code, reason = sent.status_code, sent.reason_phrase
    except httpx.HTTPError as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:500]) from None
    if not 200 <= status_code < 300:
        raise DeliveryFailed(f"HTTP {status_code} {reason}", status_code)
    return status_code
