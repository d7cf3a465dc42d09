from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions.models import ApiToken


class Command(BaseCommand):
    help = "List API tokens, or revoke one by id or prefix. New ones: create_api_token."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True)
        listing = sub.add_parser(
            "list", help="every token: id, prefix, team, name, last used, expiry, revoked, scopes"
        )
        listing.add_argument("--team", help="only this team's (slug)")
        revoke = sub.add_parser("revoke", help="refuse a token from now on")
        revoke.add_argument("token", help="the token's id or its prefix (gl_…)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["command"] == "list":
            tokens = ApiToken.objects.select_related("team").order_by("team__slug", "name")
            if options.get("team"):
                tokens = tokens.filter(team__slug=options["team"])
            self.stdout.write(
                f"{'id':>5}  {'prefix':<11} {'team':<15} {'name':<20} {'last used':<17} {'expires':<17}"
                f" {'revoked':<17} scopes"
            )
            for t in tokens:
                used = f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never"
                expires = f"{t.expires_at:%Y-%m-%d %H:%M}" if t.expires_at else "-"
                revoked = f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "-"
                self.stdout.write(
                    f"{t.pk:>5}  {t.prefix:<11} {t.team.slug:<15} {t.name:<20} {used:<17} {expires:<17}"
                    f" {revoked:<17} {','.join(t.scopes)}"
                )
            return
        ref = options["token"]
        matches = (
            ApiToken.objects.filter(pk=int(ref))
            if ref.isdigit()
            else ApiToken.objects.filter(prefix=ref[:10])
        )
        if matches.count() != 1:
            raise CommandError(
                f"{ref!r} matches {matches.count()} tokens; give the id from `api_tokens list`"
            )
        token = matches.get()
        token.revoke()
        self.stdout.write(f"revoked {token.name} ({token.prefix}…) of team {token.team.slug}")
