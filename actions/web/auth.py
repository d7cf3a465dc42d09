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

from django import forms
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
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


# Spraying: one address trying a few passwords on many usernames, or many addresses trying one
# username, stays under the per-pair limit. Each gets a wider, higher limit whose cool-off is
# short (GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS): it slows guessing down without letting anyone
# lock a user, or a whole office behind one address, out for long.


def _network(address: str) -> str:
    """The unit one client controls: an IPv4 address, or an IPv6 /64 (one host's whole range)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def _spray_keys(request: HttpRequest, username: str) -> list[tuple[str, int]]:
    return [
        (f"login-spray:address:{_network(client_ip(request))}", settings.GRUNDLAG_LOGIN_ADDRESS_ATTEMPTS),
        (f"login-spray:user:{username}", settings.GRUNDLAG_LOGIN_USER_ATTEMPTS),
    ]


def spray_throttled(request: HttpRequest, username: str) -> bool:
    return any(cache.get(f"{key}:cooling") for key, _ in _spray_keys(request, username))


@receiver(user_login_failed)
def count_failure(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    if request is None or getattr(request, "grundlag_throttled", False):
        return  # a refused attempt checked no password: it is not another guess
    if getattr(request, "grundlag_sign_in", False):
        return  # the identity provider's sign-in refused (actions.web.sso): no password either
    for key, limit in _spray_keys(request, login_username(request, credentials)):
        cache.add(key, 0, settings.GRUNDLAG_LOGIN_WINDOW_SECONDS)
        try:
            failures = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, failures := 1, settings.GRUNDLAG_LOGIN_WINDOW_SECONDS)
        if failures >= limit:
            # A short pause, then the count starts again: guessing is slowed, no one locked out.
            cache.set(f"{key}:cooling", True, settings.GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS)
            cache.delete(key)


def not_a_password(request: HttpRequest | None, credentials: dict[str, Any] | None = None) -> bool:
    """django-axes counts no failure of the identity provider's sign-in: no password was sent
    (the callback's code and state are not kept either)."""
    return request is not None and bool(getattr(request, "grundlag_sign_in", False))


class SprayThrottleBackend(ModelBackend):
    """First of the authentication backends: refuses, before any password is checked, while
    the client's address or the username has failed too often recently. It authenticates no
    one itself; it is a ModelBackend so that, being first, it can load the user of a session
    it is named in (``Client.force_login`` names the first backend)."""

    def authenticate(  # type: ignore[override]
        self, request: HttpRequest | None, username: str | None = None, **kwargs: Any
    ) -> None:
        if request is not None and spray_throttled(request, login_username(request, {"username": username})):
            request.grundlag_throttled = True  # type: ignore[attr-defined]
            raise PermissionDenied("too many failed logins")
        return None


class LoginForm(AuthenticationForm):
    """Says so when a login was refused by the spray throttle, not "wrong password"."""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except forms.ValidationError:
            if getattr(self.request, "grundlag_throttled", False):
                seconds = settings.GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS
                raise forms.ValidationError(
                    f"Too many failed logins from your network or for this user. Wait {seconds} seconds "
                    "and try again.",
                    code="throttled",
                ) from None
            raise
