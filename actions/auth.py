"""Login with throttling: after too many failures for one username, or from one address, further
attempts are refused for a while, whatever the password."""

from __future__ import annotations

import hashlib
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.http import HttpRequest


def _keys(request: HttpRequest | None, username: str) -> list[str]:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    return [f"login-fail:user:{digest}", f"login-fail:addr:{address}"]


class ThrottledAuthenticationForm(AuthenticationForm):
    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": "Too many failed attempts. Wait %(minutes)s minutes and try again.",
    }

    def clean(self) -> dict[str, Any]:
        username = self.data.get("username", "")
        keys = _keys(self.request, username)
        limit = settings.GRUNDLAG_LOGIN_ATTEMPTS
        if any((cache.get(key) or 0) >= limit for key in keys):
            raise forms.ValidationError(
                self.error_messages["throttled"],
                code="throttled",
                params={"minutes": settings.GRUNDLAG_LOGIN_LOCKOUT_SECONDS // 60},
            )
        try:
            return super().clean()
        except forms.ValidationError:
            for key in keys:
                cache.add(key, 0, settings.GRUNDLAG_LOGIN_LOCKOUT_SECONDS)
                cache.incr(key)
            raise


class ThrottledLoginView(LoginView):
    form_class = ThrottledAuthenticationForm
