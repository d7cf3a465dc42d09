"""The company's directory, as it provisions the site (SCIM 2.0: actions.scim): its users and
groups kept as it writes them (DirectoryResource), and the site following them.

- **A user** is a user of the site's, found by the directory's id once linked (by their
  username the first time: an account made before provisioning is taken over, not doubled).
  Their username, email, names and whether they are active follow the directory's.
- **Deactivated or deleted** in the directory, their account is disabled: they are signed out
  at their next request, and their absences and the grants they gave end
  (actions.engine.members.left, by the user's post_save).
- **A group** opens the teams its name (or its externalId) is mapped to, in a role, by the
  admin's sign-in groups, as the groups claim of single sign-on does: whenever a group or its
  members change, each person concerned has the memberships their groups give, in the teams
  the mappings manage (actions.engine.members.from_groups).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db.models import Q

from actions.engine import store
from actions.engine.errors import InvalidInput
from actions.engine.journal import atomic
from actions.engine.members import from_groups, roles_for, sign_in_groups
from actions.models import DirectoryResource

logger = logging.getLogger(__name__)

USER, GROUP = "User", "Group"
_USERNAME = re.compile(r"^[\w.@+-]{1,150}$", re.ASCII)


def lock() -> None:
    """Hold the directory for the rest of this transaction: a SCIM operation reads it whole and
    writes what it decided from that, so two at once must not interleave (two PATCHes of one
    group would lose one)."""
    store.lock_directory()


def resources(resource_type: str) -> list[dict[str, Any]]:
    """Every stored resource of the type, as the directory wrote it."""
    return list(
        DirectoryResource.objects.filter(resource_type=resource_type).values_list("payload", flat=True)
    )


def save(resource_type: str, payload: dict[str, Any]) -> None:
    """Keep the resource as the directory wrote it (made or replaced), and follow it."""
    payload = {name: value for name, value in payload.items() if name != "password"}  # never kept
    with atomic():
        stored = DirectoryResource.objects.filter(resource_type=resource_type, resource_id=payload["id"])
        previous: dict[str, Any] = stored.values_list("payload", flat=True).first() or {}
        row, _ = DirectoryResource.objects.update_or_create(
            resource_type=resource_type, resource_id=payload["id"], defaults={"payload": payload}
        )
        if resource_type == USER:
            _follow_user(row, previous)
            return
        before, after = set(_member_ids(previous)), set(_member_ids(payload))
        if _names(previous) == _names(payload):
            _refresh_groups(before ^ after)  # who joined, and who left
        else:
            _refresh_groups(before | after)  # what the group opens changed: everyone's


def delete(resource_type: str, resource_id: str) -> None:
    """The directory deleted the resource: a user's account is disabled and leaves the teams
    the directory manages; a group's members leave what it opened."""
    with atomic():
        row = DirectoryResource.objects.filter(resource_type=resource_type, resource_id=resource_id).first()
        if row is None:
            return
        if resource_type == USER:
            user = row.user
            row.delete()
            if user is not None:
                if user.is_active:
                    user.is_active = False
                    user.save(update_fields=["is_active"])  # what they left behind ends (its post_save)
                _, managed = roles_for(())
                from_groups(user, {}, managed, via="the directory")
        else:
            members = set(_member_ids(row.payload))
            row.delete()
            _refresh_groups(members)


def _follow_user(row: DirectoryResource, previous: dict[str, Any]) -> None:
    payload = row.payload
    username = str(payload.get("userName") or "")
    if not _USERNAME.fullmatch(username):
        raise InvalidInput(
            f"userName {username!r} is not a username here: 1 to 150 ASCII letters, digits and _.@+-",
            [
                {
                    "loc": ["userName"],
                    "msg": "1 to 150 ASCII letters, digits and _.@+-",
                    "type": "invalidValue",
                }
            ],
        )
    users = get_user_model().objects
    user = row.user
    if user is None:
        # An account made before provisioning is taken over, not doubled; never a staff
        # member's, nor one disabled here (a username a former colleague had).
        user = users.filter(username__iexact=username, directory_resource=None).first()
        if user is not None and (user.is_staff or user.is_superuser or not user.is_active):
            raise InvalidInput(
                f"userName {username!r} is an account here the directory may not take over"
                " (staff, or disabled): link it in the admin, or provision another userName",
                [
                    {
                        "loc": ["userName"],
                        "msg": "an account the directory may not take over",
                        "type": "uniqueness",
                    }
                ],
            )
    if user is None:
        user = users.create_user(username)
        logger.info("directory: made user %s", username)

    name = payload.get("name") or {}
    fields = {
        # Kept as it was first: assignments, policies and rules name people by their username.
        "username": user.username or username,
        "email": _primary_email(payload.get("emails") or []),
        "first_name": str(name.get("givenName") or "")[:150],
        "last_name": str(name.get("familyName") or "")[:150],
        "is_active": _active(user, payload, previous),
    }
    changed = [field for field, value in fields.items() if getattr(user, field) != value]
    for field in changed:
        setattr(user, field, fields[field])
    if changed:
        user.save(update_fields=changed)  # inactive: signed out, absences and grants ended
    if row.user_id != user.pk:
        row.user = user
        row.save(update_fields=["user"])
    _refresh_groups({row.resource_id})


def _active(user: Any, payload: dict[str, Any], previous: dict[str, Any]) -> bool:
    """Whether the account is active: as the directory says, but a directory that leaves
    ``active`` out changes nothing, and it re-enables only what it disabled itself (not an
    account an admin disabled here)."""
    if "active" not in payload:
        return bool(user.is_active)
    if payload["active"] is False:
        return False
    disabled_by_directory = previous.get("active") is False
    return bool(user.is_active or disabled_by_directory or not user.pk)


def _primary_email(emails: list[Any]) -> str:
    chosen = next((e for e in emails if isinstance(e, dict) and e.get("primary")), None) or next(
        (e for e in emails if isinstance(e, dict)), None
    )
    value = str(chosen.get("value") or "") if chosen else ""
    try:
        validate_email(value)
    except ValidationError:
        if value:
            raise InvalidInput(
                f"{value[:60]!r} is not an email address",
                [{"loc": ["emails"], "msg": "not an email address", "type": "invalidValue"}],
            ) from None
        return ""
    return value[:254]


def _names(payload: dict[str, Any]) -> set[str]:
    return {str(payload.get(key)) for key in ("displayName", "externalId") if payload.get(key)}


def _member_ids(payload: dict[str, Any]) -> Iterable[str]:
    for member in payload.get("members") or []:
        if isinstance(member, dict) and member.get("value"):
            yield str(member["value"])


def _refresh_groups(user_ids: set[str]) -> None:
    """Each of these directory users gets the memberships their groups give (none, disabled)."""
    if not user_ids:
        return
    groups = DirectoryResource.objects.filter(resource_type=GROUP)
    names_of: dict[str, set[str]] = {user_id: set() for user_id in user_ids}
    for payload in groups.values_list("payload", flat=True):
        names = _names(payload)
        for member in _member_ids(payload):
            if member in names_of:
                names_of[member] |= names
    linked = DirectoryResource.objects.filter(
        Q(resource_type=USER), Q(resource_id__in=list(user_ids)), ~Q(user=None)
    ).select_related("user")
    mapping = sign_in_groups()
    for row in linked:
        roles, managed = roles_for(names_of.get(row.resource_id, set()), mapping)
        if row.user is not None:
            from_groups(row.user, roles if row.user.is_active else {}, managed, via="the directory")
