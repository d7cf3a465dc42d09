"""Teams, their members and what each may do there (roles), their inbox streams, API tokens and
idempotency keys; who acted (Actor)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection
from datetime import datetime
from typing import Any, ClassVar

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models
from django.utils import timezone


class Team(models.Model):
    """A shared inbox. Its members are the reviewers of its interrupts."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="teams", blank=True
    )
    created_at = models.DateTimeField(default=timezone.now)
    # Changed (to a random number) whenever the team's rules or grants change: each process
    # keeps them compiled (actions.engine.rules) and reads only this to know they are current.
    rules_version = models.BigIntegerField(default=0, editable=False)

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Never written back from a loaded instance: a team saved in the admin while a rule
        # changed would put the old version back, and processes would keep the old rules.
        if not self._state.adding and kwargs.get("update_fields") is None:
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name != "rules_version"
            ]
        super().save(*args, **kwargs)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def where(cls, user: Any, roles: Collection[str]) -> models.QuerySet[Team]:
        """The teams in which ``user`` has one of ``roles`` (Role's groups: Role.DECIDE...)."""
        return cls.objects.filter(memberships__user=user, memberships__role__in=roles)


class Role(models.TextChoices):
    """What a member may do in their team. Each role may what the one before it may, but the
    auditor's, which only reads."""

    VIEWER = "viewer", "viewer"  # sees the team's inbox, runs and history; comments
    APPROVER = "approver", "approver"  # also decides (and so grants, delegates, cancels)
    ADMIN = "admin", "admin"  # also manages the team: its members, rules, policies, tokens
    AUDITOR = "auditor", "auditor"  # reads the team's history, exports and event log; never decides

    # The roles that may each thing. A refusal names the first of its group (Role.needed).
    READ: ClassVar[frozenset[str]]  # runs, interrupts, history, exports, the event log
    WORK: ClassVar[frozenset[str]]  # the inbox (live), comments
    DECIDE: ClassVar[frozenset[str]]
    MANAGE: ClassVar[frozenset[str]]

    @staticmethod
    def needed(roles: Collection[str]) -> str:
        """The least role of a group, for a refusal to name ("needs the approver role")."""
        return next(role for role in ("viewer", "approver", "admin", "auditor") if role in roles)


Role.READ = frozenset({Role.VIEWER, Role.APPROVER, Role.ADMIN, Role.AUDITOR})
Role.WORK = frozenset({Role.VIEWER, Role.APPROVER, Role.ADMIN})
Role.DECIDE = frozenset({Role.APPROVER, Role.ADMIN})
Role.MANAGE = frozenset({Role.ADMIN})


class Membership(models.Model):
    """A person's place in a team, with their role. (The table is the one Team.members had
    before roles: every member then became an approver.)"""

    team = models.ForeignKey(Team, models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="memberships")
    # The database's default too: a process of the version before, during a rolling upgrade,
    # adds members without a role.
    role = models.CharField(
        max_length=16, choices=Role.choices, default=Role.APPROVER, db_default=Role.APPROVER
    )

    class Meta:
        db_table = "actions_team_members"
        unique_together = [("team", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}: {self.role}"

    @classmethod
    def has(cls, user_id: Any, team_ids: Collection[int], roles: Collection[str]) -> bool:
        """Whether the user has one of ``roles`` in one of these teams."""
        return cls.objects.filter(user_id=user_id, team_id__in=team_ids, role__in=roles).exists()

    @classmethod
    def who_decide(cls, team: Any, usernames: Collection[str]) -> set[str]:
        """Those of ``usernames`` who decide in ``team`` (its approvers and admins)."""
        found = cls.objects.filter(team=team, role__in=Role.DECIDE, user__username__in=list(usernames))
        return set(found.values_list("user__username", flat=True))

    @classmethod
    def roles_of(cls, user_id: Any, team_ids: Collection[int]) -> set[str]:
        """The roles the user has in these teams (one per team they are a member of)."""
        return set(cls.objects.filter(user_id=user_id, team_id__in=team_ids).values_list("role", flat=True))


class SignInGroup(models.Model):
    """A group of the identity provider's (its groups claim, GRUNDLAG_OIDC_GROUPS_CLAIM) that
    makes its members members of a team in a role when they sign in with it. A team with any
    such group has its members from the provider: at each sign-in a person's memberships of
    those teams are set to what their groups say (the strongest role where several apply), and
    ended where none does any more."""

    group = models.CharField(max_length=255, help_text="The group as the provider names it in the claim")
    team = models.ForeignKey(Team, models.CASCADE, related_name="sign_in_groups")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.APPROVER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["group", "team"], name="sign_in_group_team")]
        ordering = ["group", "team"]

    def __str__(self) -> str:
        return f"{self.group} -> {self.team}: {self.role}"


class SignInIdentity(models.Model):
    """Who a user is at the identity provider: its issuer and their subject (``sub``), the
    one claim that never changes; a user is found by it at each sign-in, never by an email
    address, which a person may change and another may then take."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, related_name="sign_in_identity")
    created_at = models.DateTimeField(default=timezone.now)
    last_signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sign_in_identity_subject")]

    def __str__(self) -> str:
        return f"{self.user} ({self.subject} at {self.issuer})"


class DirectoryResource(models.Model):
    """A user or a group as the company's directory provisions it (SCIM 2.0, actions.scim):
    the resource as the directory last wrote it (its password never kept), and the site's user
    it is (a user's). The site's users and memberships follow it (actions.engine.directory)."""

    resource_type = models.CharField(max_length=20)  # "User" or "Group"
    resource_id = models.CharField(max_length=64)
    payload = models.JSONField()
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="directory_resource"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["resource_type", "resource_id"], name="directory_resource_id")
        ]

    def __str__(self) -> str:
        return f"{self.resource_type} {self.resource_id}"


# The roles by what they let a member do, the strongest first: where a person's groups give
# them several roles in one team, the first of these they have is theirs.
ROLE_STRENGTH = (Role.ADMIN, Role.APPROVER, Role.VIEWER, Role.AUDITOR)


class InboxStream(models.Model):
    """The sequence number of a team's inbox stream: one more for every change of the team's
    pending interrupts, counted in the transaction that makes the change. Pages follow it to
    know they missed nothing (actions.live.push); a gap makes them refetch."""

    team = models.OneToOneField(Team, models.CASCADE, primary_key=True, related_name="inbox_stream")
    seq = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.team_id}: {self.seq}"


def hash_token(key: str) -> str:
    # Tokens are 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(key.encode()).hexdigest()


class Scope(models.TextChoices):
    """What an API token may do: each API operation and the MCP endpoint name the scopes that
    let a token call them (a refusal, 403, names the one missing)."""

    RUNS_WRITE = "runs:write", "start, read and cancel runs (actions, agents, scripts)"
    APPROVALS_WRITE = "approvals:write", "ask for approvals from an outside service, and read them"
    INTERRUPTS_READ = "interrupts:read", "list the team's interrupts and read its runs"
    # Never for a decision where separation of duties applies: a token is nobody in particular
    # (actions.engine.policies.separation_of_duties refuses it whatever its scopes).
    INTERRUPTS_DECIDE = "interrupts:decide", "approve and reject the team's interrupts"
    HISTORY_READ = "history:read", "read the team's decided history"
    WEBHOOKS_WRITE = "webhooks:write", "add, list and remove the team's webhooks"
    MCP = "mcp", "call the team's actions, and its MCP gateway's tools, as MCP tools"
    GATEWAY_WRITE = "gateway:write", "register, list and remove the team's upstream MCP servers"
    # The whole site's people, not one team's: made by staff or on the command line only.
    SCIM = "scim", "provision the site's users and groups from the directory (SCIM; staff only)"

    @classmethod
    def of_a_team(cls) -> list[str]:
        """Every scope that acts within the token's team (all but scim)."""
        return [scope for scope in cls.values if scope != cls.SCIM]


class ApiToken(models.Model):
    """A bearer token for the HTTP API and MCP. It acts for one team, within its scopes, until
    it expires or is revoked; only its hash is stored."""

    team = models.ForeignKey(Team, models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    # Scope's values. The tokens made before scopes have every one: what they could do then.
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    expires_at = models.DateTimeField(null=True, blank=True)  # None: until revoked
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["team", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(
        cls,
        team: Team,
        name: str,
        scopes: Collection[str] | None = None,
        *,
        expires_at: datetime | None = None,
        created_by: Any = None,
    ) -> tuple[ApiToken, str]:
        """Create a token (with every scope of a team's unless ``scopes`` says which) and return
        it with its key, which is shown once and never stored."""
        chosen = Scope.of_a_team() if scopes is None else [scope for scope in Scope.values if scope in scopes]
        if unknown := sorted(set(scopes or ()) - set(Scope.values)):
            raise ValueError(f"not a scope: {', '.join(unknown)} (the scopes: {', '.join(Scope.values)})")
        key = "gl_" + secrets.token_urlsafe(32)
        token = cls.objects.create(
            team=team,
            name=name,
            prefix=key[:10],
            key_hash=hash_token(key),
            scopes=chosen,
            expires_at=expires_at,
            created_by=created_by,
        )
        return token, key

    def allows(self, scopes: Collection[str]) -> bool:
        """Whether the token has one of ``scopes``."""
        return any(scope in self.scopes for scope in scopes)

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    def note_use(self) -> None:
        """Note that the token was used now: written at most once a minute (a busy client must
        not turn reads into writes)."""
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

    @staticmethod
    def key_in(header: str) -> str | None:
        """The key an ``Authorization: Bearer <key>`` header holds, if it holds one (for what
        authenticates outside ninja: the idempotency middleware, the MCP endpoint; the token it
        names is actions.engine.authenticate's to find)."""
        scheme, _, key = header.partition(" ")
        return key.strip() if scheme.lower() == "bearer" and key.strip() else None

    def revoke(self) -> None:
        ApiToken.objects.filter(pk=self.pk, revoked_at=None).update(revoked_at=timezone.now())
        self.refresh_from_db(fields=["revoked_at"])


class IdempotencyKey(models.Model):
    """A POST to the API sent with an ``Idempotency-Key`` (Stripe's semantics): the request it
    was first sent with, and once answered, the answer, replayed to a retry with the same key.

    The row is written in the transaction of the change the request made (a run started, an
    interrupt decided), so that the change and the key are kept together or not at all: a
    request that changed nothing (refused, invalid) keeps no key, and may be sent again. Kept
    24 hours per token (actions.engine.idempotency.prune, in the periodic round)."""

    token = models.ForeignKey(ApiToken, models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    # SHA-256 of the method, path and body: the same key with another request is refused.
    request_hash = models.CharField(max_length=64)
    # The run the change was made to (where it was one), for a retry to be told of it should
    # the first request never have been answered (its process stopped).
    run = models.ForeignKey("Run", models.SET_NULL, null=True, blank=True, related_name="+", db_index=False)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # The first answer, once it was given: None while the request is still being answered.
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.BinaryField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["token", "key"], name="idempotency_token_key")]

    def __str__(self) -> str:
        return f"{self.key} ({self.token})"


Actor = AbstractBaseUser | AnonymousUser | ApiToken | None


def actor_name(by: Actor) -> str:
    if isinstance(by, ApiToken):
        return f"API token {by.name}"
    if by is None or not by.is_authenticated:
        return "system"
    return str(by.get_username())


def actor_user(by: Actor) -> Any:
    if isinstance(by, ApiToken) or by is None or not by.is_authenticated:
        return None
    return by
