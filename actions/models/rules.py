"""What a team sets about deciding: policies, rules, standing grants, time away."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from actions.models.base import JSONField
from actions.models.runs import Interrupt, Run
from actions.models.teams import Team


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
