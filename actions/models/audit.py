"""The event log (each run's, hash-chained) and the audit's own records."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from actions.models.base import JSONField, where_set
from actions.models.runs import Interrupt, Run


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

    # Not indexed alone: runevent_run_seq (run, seq) serves every lookup by run.
    run = models.ForeignKey(Run, models.CASCADE, related_name="events", db_index=False)
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
