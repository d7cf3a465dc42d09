from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import Any, Literal, get_args

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models
from django.urls import reverse
from django.utils import timezone

from actions.core import value_problem

TOO_DEEP = "(too deep to show)"


class JSONField(models.JSONField):
    """Django's JSONField, whose rows load whatever was stored. A value nested too deeply to
    decode (stored before every value was bounded, or by hand) loads as a placeholder, so that
    the pages, lists and admin that show its row still answer."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except RecursionError:
            return TOO_DEEP


def where_set(field: str, name: str) -> models.Index:
    """An index of the rows whose nullable ``field`` is set. Engine writes leave most of these
    foreign keys empty (an event by the engine has no actor), and an index of NULLs is a page
    written by every insert for no query: the ones these serve (a deleted user's rows, an
    escalation's interrupts, a pruned interrupt's events) name a value."""
    return models.Index(fields=[field], name=name, condition=models.Q(**{f"{field}__isnull": False}))


class Team(models.Model):
    """A shared inbox. Its members are the reviewers of its interrupts."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="teams", blank=True)
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


class ApiToken(models.Model):
    """A bearer token for the HTTP API. It acts for one team; only its hash is stored."""

    team = models.ForeignKey(Team, models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["team", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, team: Team, name: str) -> tuple[ApiToken, str]:
        """Create a token and return it with its key, which is shown once and never stored."""
        key = "gl_" + secrets.token_urlsafe(32)
        token = cls.objects.create(team=team, name=name, prefix=key[:10], key_hash=hash_token(key))
        return token, key

    @classmethod
    def authenticate(cls, key: str) -> ApiToken | None:
        try:
            # get(), not first(): one row or none, so no ORDER BY (the model's, by team name,
            # took a join and a third of the query's compiling, on every API request).
            token = cls.objects.select_related("team").get(key_hash=hash_token(key), revoked_at=None)
        except cls.DoesNotExist:
            return None
        now = timezone.now()
        # Written at most once a minute: a busy client must not turn reads into writes.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            cls.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token

    @classmethod
    def from_authorization(cls, header: str) -> ApiToken | None:
        """The token an ``Authorization: Bearer <key>`` header names, if it is one in force
        (for what authenticates outside ninja: the idempotency middleware, the MCP endpoint)."""
        scheme, _, key = header.partition(" ")
        return cls.authenticate(key.strip()) if scheme.lower() == "bearer" and key.strip() else None

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


class Run(models.Model):
    """One invocation of an action, an agent conversation or a script, from start to end."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        INTERRUPTED = "interrupted"
        COMPLETED = "completed"
        FAILED = "failed"
        REJECTED = "rejected"
        CANCELLED = "cancelled"

    class Consumer(models.TextChoices):
        DASHBOARD = "dashboard"
        API = "api"
        AGENT = "agent"
        SANDBOX = "sandbox"
        # An approval asked for by a service outside (POST /api/approvals): a run of one pause.
        APPROVAL = "approval"
        # A tool call of an agent host, through the MCP endpoint (actions.mcp): a plain action's run.
        MCP = "mcp"

    SETTLED = (
        Status.INTERRUPTED,
        Status.COMPLETED,
        Status.FAILED,
        Status.REJECTED,
        Status.CANCELLED,
    )
    FINISHED = (Status.COMPLETED, Status.FAILED, Status.REJECTED, Status.CANCELLED)

    action = models.CharField(max_length=200)
    input = JSONField(default=dict)
    # Indexed by run_team_created, which starts with it.
    team = models.ForeignKey(Team, models.PROTECT, related_name="runs", db_index=False)
    consumer = models.CharField(max_length=20, choices=Consumer.choices, default=Consumer.API)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    output = JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    started_by_name = models.CharField(max_length=150, blank=True)
    # The API token that started it, if one did: separation of duties tells a token's own runs apart.
    started_by_token = models.ForeignKey(
        "ApiToken", models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # Driver-specific, server-side state: an agent's conversation, a script's source and call log.
    driver_state = JSONField(default=dict, blank=True)
    # A claimed step holds a lease; the sweeper re-queues a step whose lease ran out (a dead worker).
    attempt = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["team", "-created_at"], name="run_team_created"),
            # What the sweeper looks for, and prune_runs. Only runs in that state are in each,
            # so a run's step changes one small index, not a page of every status.
            models.Index(fields=["updated_at"], name="run_queued", condition=models.Q(status="queued")),
            models.Index(
                fields=["lease_expires_at"], name="run_running", condition=models.Q(status="running")
            ),
            # What a claim counts of the run's team (its token's, its scripts) to keep the team
            # to its share of the workers (store.claim_queued): only running runs are in it.
            models.Index(
                fields=["team", "consumer", "started_by_token"],
                name="run_running_team",
                condition=models.Q(status="running"),
            ),
            where_set("finished_at", "run_finished"),
            where_set("started_by", "run_started_by"),
            where_set("started_by_token", "run_started_by_token"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} of {self.action} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("run", args=[self.pk])

    @classmethod
    def visible_to(cls, user: Any) -> models.QuerySet[Run]:
        """The runs a user may see: all for staff; otherwise their teams' runs, and runs with an
        interrupt escalated to one of their teams."""
        if user.is_staff:
            return cls.objects.all()
        teams = Team.objects.filter(members=user)
        escalated = Interrupt.objects.filter(escalate_to__in=teams, escalated_at__isnull=False)
        return cls.objects.filter(models.Q(team__in=teams) | models.Q(pk__in=escalated.values("run_id")))

    @property
    def is_settled(self) -> bool:
        return self.status in self.SETTLED

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


class Interrupt(models.Model):
    """One pause of a run: why, what the caller must answer, and how it was resolved."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    # Both indexed by a composite that starts with them: (run, seq) and interrupt_team_created. Every
    # index here is rewritten when an interrupt is created or decided, so none should be redundant.
    run = models.ForeignKey(Run, models.CASCADE, related_name="interrupts", db_index=False)
    seq = models.PositiveIntegerField()
    team = models.ForeignKey(Team, models.PROTECT, related_name="interrupts", db_index=False)
    action = models.CharField(max_length=200)
    message = models.TextField()
    data = JSONField(null=True, blank=True)
    # The action's private checkpoint. Never rendered, serialised or pushed; see
    # tests/test_security.py (test_the_checkpoint_never_leaves_the_server) and tests/test_consumers.py.
    state = JSONField(null=True, blank=True)
    # For agent runs: the suspended tool call this interrupt belongs to.
    tool_call_id = models.CharField(max_length=200, blank=True)
    # Exactly which call its answer is for, so that the answer resumes that call and no other:
    # an agent's turn, position, action and argument hash; a script's position, action and
    # argument hash; a plain action's name. See actions.engine.driving.call_binding.
    binding = JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    answer = JSONField(null=True, blank=True)
    # An agent's tool call approved with arguments the reviewer edited: the call runs with
    # these, and the model sees the call as edited. The proposed ones stay in the binding's
    # hash, the run's messages as they were, and the event log.
    edited_arguments = JSONField(null=True, blank=True)
    # What the paused call was given, for an agent's tool call or a script's call (a plain
    # action's is its run's input). Rules and grants read it as ``input``.
    arguments = JSONField(null=True, blank=True)
    # The JSON Schema its answer must fit, when the pause brings its own (an approval asked
    # for through the API); otherwise its action's answer model says.
    answer_schema = JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    decided_by_name = models.CharField(max_length=150, blank=True)
    # How: dashboard, api, email, slack, bulk, deadline (a policy decided it), rule, grant.
    decided_via = models.CharField(max_length=20, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Its policy, fixed when it was created (see ApprovalPolicy).
    expires_at = models.DateTimeField(null=True, blank=True)
    default_answer = JSONField(null=True, blank=True)
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalate_to = models.ForeignKey(
        Team, models.SET_NULL, null=True, blank=True, related_name="escalated_interrupts", db_index=False
    )
    escalated_at = models.DateTimeField(null=True, blank=True)
    # When its reviewers were reminded that the deadline is near (once).
    reminded_at = models.DateTimeField(null=True, blank=True)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    assignees = JSONField(default=list, blank=True)
    # Off: whoever started the run may not approve it (separation of duties).
    requester_may_approve = models.BooleanField(default=True)

    class Meta:
        # By the run's id, not the run: ordering by a foreign key orders by the related model's
        # own ordering, which joins actions_run into every query of interrupts.
        ordering = ["-run_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="interrupt_run_seq"),
        ]
        indexes = [
            # A team's interrupts, newest first (the API's list). Not by status: a decision
            # would move the entry, and the inbox reads interrupt_status_created.
            models.Index(fields=["team", "-created_at", "-id"], name="interrupt_team_created"),
            models.Index(fields=["status", "-created_at"], name="interrupt_status_created"),
            # The history's keyset paging walks (created_at, id) backwards.
            models.Index(fields=["-created_at", "-id"], name="interrupt_created_id"),
            # What the policy sweep looks for: only pending interrupts with a deadline (or an
            # escalation time) are in them.
            models.Index(
                fields=["expires_at"],
                name="interrupt_deadline",
                condition=models.Q(status="pending", expires_at__isnull=False),
            ),
            models.Index(
                fields=["escalate_at"],
                name="interrupt_escalation",
                condition=models.Q(status="pending", escalate_at__isnull=False),
            ),
            where_set("decided_by", "interrupt_decided_by"),
            where_set("escalate_to", "interrupt_escalate_to"),
        ]

    def __str__(self) -> str:
        return f"Interrupt {self.run_id}#{self.seq} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("interrupt", args=[self.pk])

    @property
    def is_pending(self) -> bool:
        return self.status == self.Status.PENDING

    @property
    def team_ids(self) -> list[int]:
        """The teams whose members see it: its own, and the one it escalated to."""
        if self.escalated_at is not None and self.escalate_to_id is not None:
            return [self.team_id, self.escalate_to_id]
        return [self.team_id]

    @classmethod
    def visible_to(cls, team_ids: Any) -> models.Q:
        return models.Q(team__in=team_ids) | models.Q(escalate_to__in=team_ids, escalated_at__isnull=False)

    def summary(self, limit: int = 100) -> str:
        """``data`` on one line, for the inbox."""
        if self.data is None:
            return ""
        if isinstance(self.data, dict):
            text = ", ".join(f"{k}: {_short(v)}" for k, v in self.data.items())
        else:
            text = _short(self.data)
        return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value_problem(value) is not None:
        return "(too deep to show)"
    return json.dumps(value, ensure_ascii=False)


class Approval(models.Model):
    """One person's approval of an interrupt that needs several (N-of-M).

    Approvals count towards one answer. An approval with a different answer supersedes the
    ones before it (they are kept, for the transcript) and the count starts again from it."""

    interrupt = models.ForeignKey(Interrupt, models.CASCADE, related_name="approvals")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.PROTECT, related_name="+")
    answer = JSONField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)
    superseded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["interrupt", "user"],
                name="one_counted_approval_per_person",
                condition=models.Q(superseded_at__isnull=True),
            )
        ]


class Comment(models.Model):
    """A reviewer's word in the discussion of an interrupt: kept with it, in the run's event
    log (RunEvent.Kind.COMMENTED) and the audit; ``@username`` mentions of team members are
    told by mail."""

    MAX_LENGTH = 5000

    interrupt = models.ForeignKey(Interrupt, models.CASCADE, related_name="comments")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, related_name="+")
    author_name = models.CharField(max_length=150)
    body = models.TextField(max_length=MAX_LENGTH)
    mentions = JSONField(default=list, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]


class Policy(models.Model):
    """A team's override of an action's ApprovalPolicy."""

    team = models.ForeignKey(Team, models.CASCADE, related_name="policies")
    action = models.CharField(max_length=200)
    deadline_minutes = models.PositiveIntegerField(null=True, blank=True)
    default_answer = JSONField(
        null=True, blank=True, help_text="Applied at the deadline. Empty: the interrupt expires instead."
    )
    escalate_after_minutes = models.PositiveIntegerField(null=True, blank=True)
    escalate_to = models.ForeignKey(Team, models.SET_NULL, null=True, blank=True, related_name="+")
    approvals_required = models.PositiveSmallIntegerField(default=1)
    assignees = models.CharField(max_length=500, blank=True, help_text="Usernames, comma-separated")
    requester_may_approve = models.BooleanField(
        null=True,
        blank=True,
        help_text="Whether whoever started a run may approve it. Empty: as the action declares.",
    )

    class Meta:
        verbose_name_plural = "policies"
        constraints = [models.UniqueConstraint(fields=["team", "action"], name="one_policy_per_team_action")]

    def __str__(self) -> str:
        return f"{self.action} in {self.team}"


class TeamRule(models.Model):
    """A team's rule (admin: Rules): ``then`` for the team's new interrupts whose condition
    (``when``, CEL) holds. The team's rules go first, by position, then the action's own; the
    first that holds wins. See actions.engine.rules."""

    class Then(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"
        REQUIRE = "require", "require approvals"
        ASSIGN = "assign", "assign to users"
        ROUTE = "route", "route to another team"

    team = models.ForeignKey(Team, models.CASCADE, related_name="rules")
    name = models.CharField(max_length=100)
    action = models.CharField(max_length=200, blank=True, help_text="Empty: every action of the team.")
    when = models.TextField(
        "condition",
        help_text="CEL over data, input, action, team and requester; e.g. "
        "<code>has(data.amount) &amp;&amp; data.amount &lt; 50</code>.",
    )
    then = models.CharField(max_length=10, choices=Then.choices)
    answer = JSONField(
        null=True,
        blank=True,
        help_text="Approve: the answer (must fit the action's). Empty: a plain approval.",
    )
    reason = models.TextField(blank=True, help_text="Reject: the reason (required).")
    approvals = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Require: how many people.")
    assignees = models.CharField(max_length=500, blank=True, help_text="Assign: usernames, comma-separated.")
    route_to = models.ForeignKey(
        Team, models.PROTECT, null=True, blank=True, related_name="+", help_text="Route: the team."
    )
    position = models.PositiveIntegerField(default=0, help_text="Lower first.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team", "position", "id"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="one_rule_name_per_team")]

    def __str__(self) -> str:
        return f"{self.name} ({self.team})"


class Grant(models.Model):
    """A standing approval: a reviewer approved and allowed the same for a while. Later
    interrupts of the same action, with the same arguments (or arguments matching
    ``condition``), from the same requester (or in the same run) are approved by it with the
    same answer, as long as the reviewer could still approve them. See actions.engine.rules."""

    team = models.ForeignKey(Team, models.CASCADE, related_name="grants")
    action = models.CharField(max_length=200)
    # Its decisions name it ("grant #12 (alice)"): it outlives its giver, void without them.
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, related_name="grants", db_index=False
    )
    granted_by_name = models.CharField(max_length=150)
    source = models.ForeignKey(Interrupt, models.SET_NULL, null=True, blank=True, related_name="+")
    answer = JSONField(null=True, blank=True)
    # One of the two: the same arguments (their hash), or arguments for which this CEL holds.
    arguments_sha256 = models.CharField(max_length=64, blank=True)
    condition = models.TextField(blank=True)
    # One of the two: the same requester ("user:<id>", "token:<id>"), or this run.
    requester = models.CharField(max_length=40, blank=True)
    requester_name = models.CharField(max_length=150, blank=True)
    run = models.ForeignKey(Run, models.CASCADE, null=True, blank=True, related_name="+")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: until revoked.")
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by_name = models.CharField(max_length=150, blank=True)
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["team", "action"], name="grant_live", condition=models.Q(revoked_at__isnull=True)
            )
        ]

    def __str__(self) -> str:
        return f"grant #{self.pk} ({self.action}, {self.granted_by_name})"

    def is_live(self, now: Any = None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    @property
    def scope(self) -> str:
        what = f"arguments where {self.condition}" if self.condition else "the same arguments"
        who = f"in run {self.run_id}" if self.run_id else f"from {self.requester_name or self.requester}"
        return f"{what}, {who}"


class Delegation(models.Model):
    """Out of office: from ``starts_at`` to ``ends_at``, new interrupts assigned to ``user``
    are assigned to ``delegate`` instead (and those pending when it starts)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="delegations")
    delegate = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="+")
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")), name="delegation_ends_after"
            ),
            models.CheckConstraint(
                condition=~models.Q(delegate=models.F("user")), name="delegation_not_to_self"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} to {self.delegate} until {self.ends_at:%Y-%m-%d %H:%M}"


class RunEventQuerySet(models.QuerySet["RunEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise TypeError("the event log is append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise TypeError("the event log is append-only")


class RunEvent(models.Model):
    """The append-only log of a run: who did what, when. Rows are never changed."""

    class Kind(models.TextChoices):
        STARTED = "started"
        CLAIMED = "claimed"
        INTERRUPTED = "interrupted"
        APPROVED = "approved"
        REJECTED = "rejected"
        RESUMED = "resumed"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        REQUEUED = "requeued"
        EXPIRED = "expired"
        ESCALATED = "escalated"
        # Its deadline is near and no one has decided: the reviewers are reminded.
        EXPIRING = "expiring"
        CHECKPOINT_VIEWED = "checkpoint_viewed"
        # A comment on one of its interrupts (the text and who was mentioned in the detail).
        COMMENTED = "commented"
        # An action raised something unexpected: the exception text and the id callers were told.
        ERROR = "error"
        # Its assignees changed: a delegate took over while someone is away.
        ASSIGNED = "assigned"

    run = models.ForeignKey(Run, models.CASCADE, related_name="events")
    interrupt = models.ForeignKey(
        Interrupt, models.CASCADE, null=True, blank=True, related_name="events", db_index=False
    )
    kind = models.CharField(max_length=30, choices=Kind.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    actor_name = models.CharField(max_length=150, blank=True)
    detail = JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now)
    # Tamper evidence (actions.engine.audit): the event's place in the whole log, and its hash
    # chained to the event before it in the whole log (hash) and in its run (run_hash).
    seq = models.BigIntegerField(null=True, blank=True, unique=True)
    hash = models.CharField(max_length=64, blank=True)
    run_hash = models.CharField(max_length=64, blank=True)

    objects = RunEventQuerySet.as_manager()

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            where_set("interrupt", "runevent_interrupt"),
            where_set("actor", "runevent_actor"),
            # The dispatcher's scan for recent events not yet fanned out (actions.notify).
            models.Index(fields=["at"], name="runevent_at"),
            # A run's newest event, whose hash the next one chains to.
            models.Index(fields=["run", "seq"], name="runevent_run_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.kind}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise TypeError("the event log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise TypeError("the event log is append-only")


# The audit's own records (actions.engine.audit): the chains' head, what pruning left of the
# chain, each verification, the heads published, and every export.

GENESIS = "0" * 64


class AuditChain(models.Model):
    """The head of the whole log's chain: one row, which every transaction that logs events
    locks, moves on and writes, as it ends."""

    seq = models.BigIntegerField(default=0)
    head = models.CharField(max_length=64, default=GENESIS)


class AuditAnchor(models.Model):
    """An event that prune_runs deleted: its place in the chain and its hash, so the events
    after it stay verifiable (the archive holds what it said)."""

    seq = models.BigIntegerField(primary_key=True)
    run_id = models.BigIntegerField()
    hash = models.CharField(max_length=64)
    pruned_at = models.DateTimeField(default=timezone.now)


class AuditCheck(models.Model):
    """One verification of the chains (`manage.py verify_audit`, or the daily round)."""

    at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField()
    events = models.BigIntegerField(default=0)
    seq = models.BigIntegerField(default=0)
    head = models.CharField(max_length=64, blank=True)
    problems = JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        get_latest_by = "at"


class AuditHead(models.Model):
    """The chain's head as published (daily: the log, the admin, webhooks): whoever rewrote the
    log and its hashes would have to rewrite every copy of these too."""

    at = models.DateTimeField(default=timezone.now)
    seq = models.BigIntegerField()
    head = models.CharField(max_length=64)

    class Meta:
        ordering = ["-at", "-id"]
        get_latest_by = "at"


class AuditExport(models.Model):
    """An export of the history: who took what (which filter, which format), when."""

    at = models.DateTimeField(default=timezone.now)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.SET_NULL, null=True, related_name="+")
    user_name = models.CharField(max_length=150)
    what = models.CharField(max_length=20)  # interrupts, events
    format = models.CharField(max_length=10)  # csv, jsonl
    filters = JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]


# Reaching reviewers and callers outside the dashboard (actions.notify). The run's event log
# is the outbox: an event is written in the transaction of its change (a rolled-back change
# has none), and the dispatcher turns each event worth telling into one Notification per
# recipient, once (Fanout).


def webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


# The event types an endpoint may subscribe to (the API's schema names them).
WebhookEvent = Literal[
    "interrupt.created",
    "interrupt.decided",
    "interrupt.escalated",
    "interrupt.expiring",
    "run.finished",
    # The audit chain's head, published daily (actions.engine.audit).
    "audit.head",
]


class Webhook(models.Model):
    """An endpoint of a calling application, told of its team's events, each request signed
    with the secret (Standard Webhooks)."""

    EVENTS: tuple[str, ...] = get_args(WebhookEvent)

    team = models.ForeignKey(Team, models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=2000)
    events = JSONField(default=list)
    secret = models.CharField(max_length=100, default=webhook_secret)
    created_at = models.DateTimeField(default=timezone.now)
    created_by_name = models.CharField(max_length=150, blank=True)
    # Since when every delivery has failed (None: the last one succeeded). After
    # GRUNDLAG_WEBHOOK_DISABLE_AFTER_SECONDS of that the endpoint is disabled, saying why.
    failing_since = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.team} -> {self.url}"


class Fanout(models.Model):
    """That an event's notifications were made: each event is fanned out once."""

    event = models.OneToOneField(RunEvent, models.CASCADE, primary_key=True, related_name="fanout")
    at = models.DateTimeField(default=timezone.now)


class Notification(models.Model):
    """One message to one recipient (a webhook endpoint, a user's mail, a team's Slack
    channel) about one event: delivered with retries and backoff, each attempt recorded."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"
        SLACK = "slack"

    class Outcome(models.TextChoices):
        PENDING = "pending"  # to be sent at next_attempt_at (or being sent, until then)
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up: out of attempts, or the endpoint is disabled
        SKIPPED = "skipped"  # no longer for its recipient (left the team, mail off): not sent

    # None: an event of the audit itself (audit.head), which no run logged.
    event = models.ForeignKey(RunEvent, models.CASCADE, null=True, related_name="notifications")
    type = models.CharField(max_length=40)  # interrupt.created, ...
    channel = models.CharField(max_length=10, choices=Channel.choices)
    webhook = models.ForeignKey(Webhook, models.CASCADE, null=True, blank=True, related_name="notifications")
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.CASCADE, null=True, blank=True, related_name="+"
    )
    # The webhook-id header: the same for every attempt, so a receiver drops a duplicate.
    message_id = models.CharField(max_length=64, unique=True)
    # A mail for someone who asked for a digest: sent with the others of the hour, in one mail.
    digest = models.BooleanField(default=False)
    # A mail's personal decision link (actions.web.links) is single use: when it decided.
    link_used_at = models.DateTimeField(null=True, blank=True)
    payload = JSONField(default=dict)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notification_due",
                condition=models.Q(outcome="pending"),
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(channel="webhook", webhook__isnull=False) | ~models.Q(channel="webhook"),
                name="notification_webhook_named",
            )
        ]

    def __str__(self) -> str:
        return f"{self.type} by {self.channel} ({self.outcome})"


class DeliveryAttempt(models.Model):
    """One try at sending a notification: what came back, or what went wrong, and how long."""

    notification = models.ForeignKey(Notification, models.CASCADE, related_name="delivery_attempts")
    at = models.DateTimeField(default=timezone.now)
    ok = models.BooleanField(default=False)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {'ok' if self.ok else 'failed'} {self.status_code or self.error}"


# Events a team's reviewers hear of by mail and in Slack, unless the team chooses otherwise.
PERSON_EVENTS = ("interrupt.created", "interrupt.escalated", "interrupt.expiring", "interrupt.decided")


def default_email_events() -> list[str]:
    return list(PERSON_EVENTS)


def default_slack_events() -> list[str]:
    return list(PERSON_EVENTS)


class TeamChannels(models.Model):
    """Which of a team's events reach its people, and where: mail (to those who may decide, or
    the requester for a decision) and a Slack channel."""

    team = models.OneToOneField(Team, models.CASCADE, primary_key=True, related_name="routing")
    email_events = JSONField(
        default=default_email_events,
        blank=True,
        help_text="Of interrupt.created, interrupt.escalated, interrupt.expiring, interrupt.decided",
    )
    slack_channel = models.CharField(
        max_length=80, blank=True, help_text="The Slack channel's id (C0123...); empty: no Slack"
    )
    slack_events = JSONField(default=default_slack_events, blank=True)

    class Meta:
        verbose_name = "team channels"
        verbose_name_plural = "team channels"

    def __str__(self) -> str:
        return f"Channels of {self.team}"


class Preferences(models.Model):
    """A person's own choices: mail or not, one at a time or a digest; their Slack user."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, models.CASCADE, primary_key=True, related_name="grundlag_preferences"
    )
    email = models.BooleanField("mail me about approvals", default=True)
    email_digest = models.BooleanField("one digest mail an hour instead of a mail each", default=False)
    slack_user_id = models.CharField(
        max_length=40,
        blank=True,
        help_text="Their Slack user id (U0123...), when their mail does not match Slack's",
    )

    class Meta:
        verbose_name_plural = "preferences"
        constraints = [
            models.UniqueConstraint(
                fields=["slack_user_id"],
                condition=~models.Q(slack_user_id=""),
                name="preferences_slack_user_once",
            )
        ]

    def __str__(self) -> str:
        return f"Preferences of {self.user}"


class SlackMessage(models.Model):
    """The Slack message that asked about an interrupt, to be updated in place when it is decided."""

    interrupt = models.ForeignKey(Interrupt, models.CASCADE, related_name="slack_messages")
    channel = models.CharField(max_length=40)
    ts = models.CharField(max_length=40)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["interrupt", "channel"], name="slackmessage_once")]

    def __str__(self) -> str:
        return f"{self.channel} {self.ts}"
