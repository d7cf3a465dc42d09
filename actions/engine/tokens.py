"""API tokens as a team's admins make and revoke them (its Team page, manage.py
create_api_token): with the scopes they choose and an expiry, the key shown once."""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.utils import timezone

from actions.engine.errors import InvalidInput, NotAllowed
from actions.engine.members import may_manage, why_not_manage
from actions.models import ApiToken, Scope, Team

MANAGE_TOKENS = "manage the team's API tokens"

# "90d", "12h", "30m": how long a new token lasts.
_DURATION = re.compile(r"^\s*(\d{1,6})\s*([dhm])\s*$")
_UNIT = {"d": timedelta(days=1), "h": timedelta(hours=1), "m": timedelta(minutes=1)}
MAX_LIFETIME = timedelta(days=5 * 366)


def lifetime(text: str) -> timedelta:
    """``90d``, ``12h`` or ``30m`` as a duration; InvalidInput otherwise."""
    found = _DURATION.match(text or "")
    duration = int(found.group(1)) * _UNIT[found.group(2)] if found else None
    if duration is None or not timedelta(minutes=1) <= duration <= MAX_LIFETIME:
        raise InvalidInput(
            f"{text!r} is not a lifetime: say 90d, 12h or 30m (at least a minute, at most 5 years)",
            [{"loc": ["expires_in"], "msg": "Say 90d, 12h or 30m.", "type": "duration"}],
        )
    return duration


def issue(
    team: Team, name: str, scopes: Collection[str], expires_in: timedelta | None, by: Any
) -> tuple[ApiToken, str]:
    """A new token of the team, with these scopes, lasting ``expires_in`` (None: until
    revoked), and its key (shown once). ``by`` None is the command line."""
    if not may_manage(by, team):
        raise NotAllowed(why_not_manage(by, team, MANAGE_TOKENS))
    name = name.strip()
    if not name or len(name) > ApiToken._meta.get_field("name").max_length:  # type: ignore[operator]
        raise InvalidInput(
            "a token needs a name of 1 to 100 characters",
            [{"loc": ["name"], "msg": "Name it (1 to 100 characters).", "type": "name"}],
        )
    if Scope.SCIM in scopes and by is not None and not by.is_staff:
        raise NotAllowed("Only staff make tokens with the scim scope: it provisions the whole site's people.")
    if not scopes:
        raise InvalidInput(
            "a token needs at least one scope",
            [{"loc": ["scopes"], "msg": "Choose what it may do.", "type": "required"}],
        )
    expires_at = timezone.now() + expires_in if expires_in is not None else None
    made_by = by if by is not None and by.is_authenticated else None
    try:
        return ApiToken.issue(team, name, scopes, expires_at=expires_at, created_by=made_by)
    except ValueError as exc:  # a scope that is none
        raise InvalidInput(str(exc), [{"loc": ["scopes"], "msg": f"{exc}.", "type": "choice"}]) from None


def revoke(token: ApiToken, by: Any) -> bool:
    """Revoke it from now on; False when it was revoked already."""
    if not may_manage(by, token.team):
        raise NotAllowed(why_not_manage(by, token.team, MANAGE_TOKENS))
    if Scope.SCIM in token.scopes and by is not None and not by.is_staff:
        raise NotAllowed(
            "Only staff revoke a token with the scim scope: it provisions the whole site's people."
        )
    was = token.revoked_at
    token.revoke()
    return was is None
