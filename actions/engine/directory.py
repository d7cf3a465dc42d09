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
from django.db.models import Q

from actions.engine.errors import InvalidInput
from actions.engine.journal import atomic
from actions.engine.members import from_groups, roles_for
from actions.models import DirectoryResource

logger = logging.getLogger(__name__)

USER, GROUP = "User", "Group"
_USERNAME = re.compile(r"^[\w.@+-]{1,150}$", re.ASCII)


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
        before = set(_member_ids(stored.values_list("payload", flat=True).first() or {}))
        row, _ = DirectoryResource.objects.update_or_create(
            resource_type=resource_type, resource_id=payload["id"], defaults={"payload": payload}
        )
        if resource_type == USER:
            _follow_user(row)
        else:
            _refresh_groups(before | set(_member_ids(payload)))  # who joined, and who left


def delete(resource_type: str, resource_id: str) -> None:
    """The directory deleted the resource: a user's account is disabled; a group's members
    leave what it opened."""
    with atomic():
        row = DirectoryResource.objects.filter(resource_type=resource_type, resource_id=resource_id).first()
        if row is None:
            return
        if resource_type == USER:
            user = row.user
            row.delete()
            if user is not None and user.is_active:
                user.is_active = False
                user.save(update_fields=["is_active"])  # what they left behind ends (its post_save)
        else:
            members = set(_member_ids(row.payload))
            row.delete()
            _refresh_groups(members)


def _follow_user(row: DirectoryResource) -> None:
    payload = row.payload
    username = str(payload.get("userName") or "")
    if not _USERNAME.match(username):
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
    user = row.user or users.filter(username=username, directory_resource=None).first()
    if user is None:
        user = users.create_user(username)
        logger.info("directory: made user %s", username)
    elif users.filter(username=username).exclude(pk=user.pk).exists():
        raise InvalidInput(
            f"userName {username!r} is another user's here",
            [{"loc": ["userName"], "msg": "taken by another user", "type": "uniqueness"}],
        )
    name = payload.get("name") or {}
    fields = {
        "username": username,
        "email": _primary_email(payload.get("emails") or []),
        "first_name": str(name.get("givenName") or "")[:150],
        "last_name": str(name.get("familyName") or "")[:150],
        "is_active": payload.get("active") is not False,
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


def _primary_email(emails: list[Any]) -> str:
    chosen = next((e for e in emails if isinstance(e, dict) and e.get("primary")), None) or next(
        (e for e in emails if isinstance(e, dict)), None
    )
    return str(chosen.get("value") or "")[:254] if chosen else ""


def _member_ids(payload: dict[str, Any]) -> Iterable[str]:
    for member in payload.get("members") or []:
        if isinstance(member, dict) and member.get("value"):
            yield str(member["value"])


def _refresh_groups(user_ids: set[str]) -> None:
    """Each of these directory users gets the memberships their groups give."""
    if not user_ids:
        return
    groups = DirectoryResource.objects.filter(resource_type=GROUP)
    names_of: dict[str, set[str]] = {user_id: set() for user_id in user_ids}
    for payload in groups.values_list("payload", flat=True):
        names = {str(payload.get(key)) for key in ("displayName", "externalId") if payload.get(key)}
        for member in _member_ids(payload):
            if member in names_of:
                names_of[member] |= names
    linked = DirectoryResource.objects.filter(
        Q(resource_type=USER), Q(resource_id__in=list(user_ids)), ~Q(user=None)
    ).select_related("user")
    for row in linked:
        roles, managed = roles_for(names_of.get(row.resource_id, set()))
        if row.user is not None and (row.user.is_active or not roles):
            from_groups(row.user, roles, managed, via="the directory")
