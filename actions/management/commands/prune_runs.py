"""Retention: delete (optionally after archiving) finished runs older than N days.

Runs that are queued, running or waiting for a decision are never touched, however old. Each
deleted event leaves an anchor (its place in the audit chain and its hash), and the archive
carries every event's hashes: `manage.py verify_audit` still verifies what remains, and the
archive can be checked against the anchors.
Run it from cron or a systemd timer, e.g. daily: `manage.py prune_runs --older-than-days 365`."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from actions.engine import audit
from actions.models import Run

BATCH = 500


class Command(BaseCommand):
    help = "Delete finished runs (and their interrupts and events) older than N days."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-days", type=int, required=True, help="finished more than N days ago"
        )
        parser.add_argument(
            "--archive", type=Path, help="first append each run, as a JSON line, to this file"
        )
        parser.add_argument("--dry-run", action="store_true", help="count, change nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than_days"]
        if days < 1:
            self.stderr.write("--older-than-days must be at least 1")
            raise SystemExit(2)
        cutoff = timezone.now() - timedelta(days=days)
        old = Run.objects.filter(status__in=Run.FINISHED, finished_at__lt=cutoff)
        if options["dry_run"]:
            self.stdout.write(f"would delete {old.count()} run(s) finished before {cutoff:%Y-%m-%d}")
            return
        deleted = 0
        archive = options["archive"].open("a") if options["archive"] else None
        try:
            while ids := list(old.values_list("pk", flat=True)[:BATCH]):
                with transaction.atomic():
                    # Re-checked inside the transaction: only runs that are still finished go.
                    # Locked: no event (a late comment) slips in between its anchors and the delete.
                    finished = Run.objects.select_for_update().filter(pk__in=ids, status__in=Run.FINISHED)
                    locked = list(finished.values_list("pk", flat=True))
                    batch = Run.objects.filter(pk__in=locked)
                    # The events' places and hashes stay: what remains of the chain verifies.
                    audit.anchor(locked)
                    if archive is not None:
                        for run in batch.prefetch_related("interrupts", "events"):
                            archive.write(json.dumps(_as_record(run), cls=DjangoJSONEncoder) + "\n")
                    deleted += len(locked)
                    batch.delete()
        finally:
            if archive is not None:
                archive.close()
        self.stdout.write(f"deleted {deleted} run(s) finished before {cutoff:%Y-%m-%d}")


def _as_record(run: Run) -> dict[str, Any]:
    fields = (
        "id",
        "action",
        "input",
        "consumer",
        "status",
        "output",
        "error",
        "started_by_name",
        "created_at",
        "finished_at",
    )
    record = {name: getattr(run, name) for name in fields}
    record["team"] = run.team_id
    record["interrupts"] = [
        {
            k: getattr(it, k)
            for k in (
                "seq",
                "action",
                "message",
                "data",
                "status",
                "answer",
                "reason",
                "decided_by_name",
                "decided_at",
                "created_at",
            )
        }
        for it in run.interrupts.all()
    ]
    record["events"] = [
        {
            "id": e.pk,
            "seq": e.seq,
            "interrupt": e.interrupt_id,
            "kind": e.kind,
            "actor_id": e.actor_id,
            "actor": e.actor_name,
            "at": audit.moment(e.at),  # to the microsecond, as hashed
            "detail": e.detail,
            "hash": e.hash,
            "run_hash": e.run_hash,
        }
        for e in run.events.order_by("seq", "id")
    ]
    return record
