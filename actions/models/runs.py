"""Runs, their interrupts (the pauses), the approvals of an N-of-M, and comments."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from actions.core import value_problem
from actions.models.base import JSONField, where_set
from actions.models.teams import Role, Team


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
        # A tool call of an agent host to a team's upstream MCP server, through the gateway
        # (actions.drivers.gateway): decided like any pause, then made once.
        GATEWAY = "gateway"

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
        interrupt escalated to one of their teams (in any role: each reads)."""
        if user.is_staff:
            return cls.objects.all()
        teams = Team.where(user, Role.READ)
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
    # Where its pause is in a trace (a W3C traceparent; NULL with traces off): its decision and
    # its notifications continue that trace (actions.tracing). Nullable, so that adding it is
    # an ALTER TABLE on SQLite too: rebuilding the table would drop its search triggers.
    traceparent = models.CharField(max_length=55, null=True, blank=True)  # noqa: DJ001

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
        theirs, escalated = cls.seen_by(team_ids)
        return theirs | escalated

    @staticmethod
    def seen_by(team_ids: Any) -> tuple[models.Q, models.Q]:
        """Why the teams see an interrupt, apart: it is theirs; it was escalated to them."""
        return models.Q(team__in=team_ids), models.Q(escalate_to__in=team_ids, escalated_at__isnull=False)

    @staticmethod
    def approvals_counted() -> models.Count:
        """How many of an N-of-M's approvals count now (those given before an answer changed
        are superseded): an annotation, or an aggregate of one interrupt's."""
        return models.Count("approvals", filter=models.Q(approvals__superseded_at=None))

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
