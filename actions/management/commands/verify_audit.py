"""Recompute the event log's hash chains (actions.engine.audit) and say whether they hold.

Exits 0 when every event fits its chains, 1 naming the first that does not (edited, deleted,
or inserted out of order directly in the database). The result is recorded: the history page
shows the last verification. Run it from cron, or after restoring a backup.
``--head PLACE:SHA256`` checks a head published before (as held outside the database);
``--archive FILE`` checks that what prunes left (anchors) is backed by their archives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions.engine import audit


class Command(BaseCommand):
    help = "Verify the event log's hash chains; exit 1 naming the first event that does not fit."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--head",
            action="append",
            default=[],
            metavar="PLACE:SHA256",
            help="a head published before, as held outside the database (the log, a webhook receiver)",
        )
        parser.add_argument(
            "--archive",
            action="append",
            default=[],
            type=Path,
            help="a prune_runs archive: every anchor must be backed by an archived event that hashes to it",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        heads = []
        for given in options["head"]:
            place, _, digest = given.partition(":")
            if not place.isdigit() or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
                raise CommandError(f"--head {given!r}: expected PLACE:SHA256 (a number, 64 hex digits)")
            heads.append((int(place), digest))
        for archive in options["archive"]:
            if not archive.is_file():
                raise CommandError(f"--archive {archive}: no such file")
        result = audit.check(by="verify_audit", heads=heads, archives=options["archive"])
        if result.ok:
            self.stdout.write(f"intact: {result.events} events, head {result.head} at place {result.seq}")
            return
        self.stderr.write(f"NOT intact: {len(result.problems)} problem(s); the first:")
        for problem in result.problems:
            self.stderr.write(f"  {problem}")
        raise SystemExit(1)
