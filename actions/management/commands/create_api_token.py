from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions import engine
from actions.models import Scope, Team


class Command(BaseCommand):
    help = (
        "Create an API token for a team and print it (alone, on the last line). Its scopes say what"
        f" it may do ({', '.join(Scope.values)}); without --scope it has every one but scim (which"
        " provisions the whole site's people from the company's directory)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("team", help="the team's slug")
        parser.add_argument("--name", default="api", help="a name to recognise the token by")
        parser.add_argument(
            "--scope",
            action="append",
            default=[],
            metavar="SCOPE",
            help="what it may do; repeat it, or separate scopes with commas (default: every scope)",
        )
        parser.add_argument(
            "--expires-in",
            metavar="DURATION",
            help="how long it lasts: 90d, 12h, 30m (default: until revoked)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            slugs = ", ".join(Team.objects.values_list("slug", flat=True)) or "none yet"
            raise CommandError(f"no team with slug {options['team']!r} (teams: {slugs})")
        scopes = [scope.strip() for each in options["scope"] for scope in each.split(",") if scope.strip()]
        try:
            lasting = engine.tokens.lifetime(options["expires_in"]) if options["expires_in"] else None
            token, key = engine.tokens.issue(
                team, options["name"], scopes or Scope.of_a_team(), lasting, None
            )
        except engine.EngineError as exc:
            raise CommandError(str(exc)) from exc
        until = f"until {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "until revoked"
        self.stderr.write(
            f"Token {token.name!r} for team {team.slug}, {until}, scopes {' '.join(token.scopes)}"
            " (shown once, store it now):"
        )
        self.stdout.write(key)
