from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions import engine
from actions.models import ReceiptKey


class Command(BaseCommand):
    help = (
        "The keys approval receipts are signed with: list them, rotate (a new key is published now"
        " and signs five minutes later; the old one stays in /.well-known/jwks.json until its"
        " receipts expire), or revoke one at once (it leaked: the receipts it signed stop verifying)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        verbs.add_parser("list")
        verbs.add_parser("rotate")
        revoke = verbs.add_parser("revoke")
        revoke.add_argument(
            "kid",
            help="the key's id, as list shows it (one that starts with - goes after --: revoke -- -Xy...)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verb"] == "rotate":
            key = engine.receipts.rotate()
            starts = key.created_at + engine.receipts.PUBLISHED_AHEAD
            self.stdout.write(f"{key.kid} is published now and signs from {starts:%Y-%m-%d %H:%M:%S} UTC")
        elif options["verb"] == "revoke":
            if not engine.receipts.revoke(options["kid"]):
                raise CommandError(f"no key {options['kid']!r} in force")
            self.stdout.write(f"{options['kid']} revoked: no longer published")
        else:
            for key in ReceiptKey.objects.all():
                state = ("revoked" if key.revoked_at else "retired" if key.retired_at else "signing") + (
                    ", published" if key.published else ""
                )
                self.stdout.write(f"{key.kid}\t{key.created_at:%Y-%m-%d %H:%M}\t{state}")
