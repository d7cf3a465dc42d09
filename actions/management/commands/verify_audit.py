"""Recompute the event log's hash chains (actions.engine.audit) and say whether they hold.

Exits 0 when every event fits its chains, 1 naming the first that does not (edited, deleted,
or inserted out of order directly in the database). The result is recorded: the history page
shows the last verification. Run it from cron, or after restoring a backup."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from actions.engine import audit


class Command(BaseCommand):
    help = "Verify the event log's hash chains; exit 1 naming the first event that does not fit."

    def handle(self, *args: Any, **options: Any) -> None:
        result = audit.check(by="verify_audit")
        if result.ok:
            self.stdout.write(f"intact: {result.events} events, head {result.head} at place {result.seq}")
            return
        self.stderr.write(f"NOT intact: {len(result.problems)} problem(s); the first:")
        for problem in result.problems:
            self.stderr.write(f"  {problem}")
        raise SystemExit(1)
