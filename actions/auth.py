"""Login throttling, by django-axes: after too many failed logins of one username from one
client address, that pair is refused for a while, whatever the password.

The pair, not the username alone (anyone could lock a user out) nor the address alone
(behind a proxy or a company's NAT, one address is everybody). The address is the client's:
the proxy's X-Forwarded-For is believed only when the request comes from a trusted proxy
(``TRUSTED_PROXIES``). django-ipware is not used for this: it trusts the header by the proxies
named inside it, which the client writes, not by the peer that actually sent the request.
"""

from __future__ import annotations

import ipaddress
import unicodedata
from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    networks: list[Network] = settings.TRUSTED_PROXY_NETWORKS
    return any(ip in network for network in networks)


def client_ip(request: HttpRequest) -> str:
    """The client's address: the nearest address in X-Forwarded-For that is not a trusted
    proxy, if the request came from a trusted proxy; otherwise the peer's own address."""
    peer = str(request.META.get("REMOTE_ADDR") or "")
    if not _trusted(peer):
        return peer
    forwarded = [hop.strip() for hop in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
    for hop in reversed([hop for hop in forwarded if hop]):
        if not _trusted(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # a garbled header: count the proxy's own address
    return peer


def login_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str:
    """The username as authentication compares it (NFKC, as Django's User normalises it),
    case-folded: ``ｒeviewer2`` (a full-width r) and ``Reviewer2`` count as ``reviewer2``."""
    raw = (credentials or {}).get("username") or request.POST.get("username", "")
    return unicodedata.normalize("NFKC", str(raw)).strip().casefold()


def locked_out(
    request: HttpRequest, credentials: dict[str, Any] | None, *args: Any, **kwargs: Any
) -> HttpResponse:
    """The login page again, saying why, with 429: not a bare error page."""
    # Unbound: validating it would authenticate (and count) once more.
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    minutes = max(settings.GRUNDLAG_LOGIN_LOCKOUT_SECONDS // 60, 1)
    error = f"Too many failed attempts. Wait {minutes} minutes and try again."
    return render(request, "registration/login.html", {"form": form, "lockout": error}, status=429)
