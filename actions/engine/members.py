"""Who is in a team, and in which role: set by the team's admins (its Team page), by staff (the
Django admin, the same page) and by automation (``manage.py team_member``, which acts for nobody
in particular, as the engine's own work does).

What a role lets a member do is checked where they do it (actions.models.Role's groups); a
change here applies to the next thing they do: a grant given by someone no longer deciding
approves nothing more (grants ask may_decide of their giver each time), their open pages re-check
at once (actions.live.push.on_role_changed)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.db.models import Q
from django.utils import timezone

from actions.engine.delegation import end_away
from actions.engine.errors import InvalidInput, NotAllowed
from actions.engine.grants import revoke_grant
from actions.engine.journal import atomic
from actions.engine.policies import role_refusal
from actions.models import ROLE_STRENGTH, Delegation, Grant, Membership, Role, SignInGroup, Team

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemberChange:
    """What changed: the user's role before (None: they were not a member) and after (None:
    they are no longer one)."""

    user: Any
    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class Left:
    """What ended with a person's account: their absences (and those they covered), and the
    standing grants they gave."""

    delegations_ended: int
    grants_revoked: int


class _Named:
    """Who ended it, as the event log and the grant say (not a user of the site's)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def get_username(self) -> str:
        return self.name


def left(user: Any, *, via: str) -> Left:
    """A person's account was disabled (by the identity provider's provisioning, or an admin):
    their time away and the absences they cover end, and the grants they gave approve nothing
    more. (They sign in no more, and their open sessions end at their next request: every
    authentication backend refuses an inactive user; their open pages close,
    actions.live.push.on_user_saved.) Nothing happens twice: each is conditional."""
    now = timezone.now()
    away = Delegation.objects.filter(Q(user=user) | Q(delegate=user), ends_at__gt=now)
    ended = 0
    for delegation in away:
        end_away(delegation)
        ended += 1
    revoked = sum(
        revoke_grant(grant, _Named(via))
        for grant in Grant.objects.filter(granted_by=user, revoked_at=None).filter(
            Q(expires_at=None) | Q(expires_at__gt=now)
        )
    )
    if ended or revoked:
        logger.info(
            "%s left (%s): %d absences ended, %d grants revoked", user.get_username(), via, ended, revoked
        )
    return Left(ended, revoked)


def on_user_saved(sender: Any, *, instance: Any, created: bool, **kwargs: Any) -> None:
    """A user saved inactive (the admin's "active" box, the directory's provisioning): what
    they left behind ends with them."""
    if not created and not instance.is_active:
        left(instance, via="account disabled")


def may_manage(by: Any, team: Team) -> bool:
    """The team's admins, and staff; None is the command line (whoever runs manage.py)."""
    if by is None:
        return True
    if not getattr(by, "is_authenticated", False):
        return False
    return bool(by.is_staff) or Team.where(by.pk, Role.MANAGE).filter(pk=team.pk).exists()


def why_not_manage(by: Any, team: Team, what: str = "change the team's members") -> str:
    return role_refusal(by, [team.pk], Role.MANAGE, what) or f"Only the admins of {team} can {what}."


def from_provider(team: Team) -> bool:
    """Whether the team's members come from the identity provider's groups (it has a sign-in
    group): then they are changed there, not here (a change here would be undone at the
    person's next sign-in)."""
    return SignInGroup.objects.filter(team=team).exists()


def set_role(team: Team, user: Any, role: str, by: Any) -> MemberChange:
    """Make ``user`` a member of ``team`` in ``role``, or change their role to it."""
    if role not in Role.values:
        raise InvalidInput(
            f"{role!r} is not a role: one of {', '.join(Role.values)}",
            [{"loc": ["role"], "msg": f"Choose one of {', '.join(Role.values)}.", "type": "choice"}],
        )
    return _change(team, user, role, by)


def remove(team: Team, user: Any, by: Any) -> MemberChange:
    """End ``user``'s membership of ``team`` (nothing changes when they were not a member)."""
    return _change(team, user, None, by)


Mapping = list[tuple[str, int, str]]  # the admin's sign-in groups: (group, team id, role)


def sign_in_groups() -> Mapping:
    return list(SignInGroup.objects.values_list("group", "team_id", "role"))


def roles_for(groups: Collection[str], mapping: Mapping | None = None) -> tuple[dict[int, str], set[int]]:
    """What these groups of the company's (a sign-in's groups claim, the directory's groups)
    make a person (team id -> the strongest role any gives), and the teams whose members the
    company manages (those with a sign-in group). ``mapping``: sign_in_groups(), read once for
    several people."""
    wanted = set(groups)
    roles: dict[int, str] = {}
    managed: set[int] = set()
    for group, team_id, role in sign_in_groups() if mapping is None else mapping:
        managed.add(team_id)
        if group in wanted:
            current = roles.get(team_id)
            if current is None or ROLE_STRENGTH.index(role) < ROLE_STRENGTH.index(current):
                roles[team_id] = role
    return roles, managed


def from_groups(
    user: Any, roles: dict[int, str], managed: Collection[int], *, via: str = "sign-in"
) -> list[MemberChange]:
    """At sign-in with the identity provider: the user's memberships of the teams whose members
    it manages (``managed``: those with a sign-in group) set to ``roles`` (team id -> role),
    ended in those where it gives none; their other memberships left as they are. The provider
    is the authority there, as the command line is: no team admin's rule binds it."""
    changes = []
    for team in Team.objects.filter(pk__in=managed).order_by("pk"):
        change = _change(team, user, roles.get(team.pk), None, via=via)
        if change.changed:
            changes.append(change)
    return changes


def _change(
    team: Team, user: Any, role: str | None, by: Any, *, via: str = "the command line"
) -> MemberChange:
    if by is not None and from_provider(team):
        raise NotAllowed(
            f"The members of {team} come from the identity provider's groups (Sign-in groups in"
            " the admin): change them there."
        )
    if not user.is_active and role is not None:
        raise InvalidInput(
            f"{user.get_username()}'s account is disabled",
            [{"loc": ["user"], "msg": "A disabled account cannot join a team.", "type": "inactive"}],
        )
    with atomic():
        # The team's row locked (on SQLite the write lock is the database's): two admins
        # demoting each other at once must not leave the team without one.
        Team.objects.select_for_update().filter(pk=team.pk).exists()
        # Asked under the lock: an admin demoted meanwhile changes nothing more.
        if not may_manage(by, team):
            raise NotAllowed(why_not_manage(by, team))
        current = Membership.objects.filter(team=team, user=user).first()
        before = current.role if current is not None else None
        if before == role:
            return MemberChange(user, before, role)
        if before == Role.ADMIN and by is not None and not by.is_staff:
            others = Membership.objects.filter(team=team, role=Role.ADMIN).exclude(user=user)
            if not others.exists():
                raise NotAllowed(
                    f"{user.get_username()} is the last admin of {team}: make someone else admin first."
                )
        if role is None:
            assert current is not None
            current.delete()
        elif current is None:
            Membership.objects.create(team=team, user=user, role=role)
        else:
            current.role = role
            current.save(update_fields=["role"])
    change = MemberChange(user, before, role)
    logger.info(
        "team %s: %s %s -> %s, by %s",
        team.slug,
        user.get_username(),
        before or "(none)",
        role or "(none)",
        by.get_username() if by is not None else via,
    )
    return change
