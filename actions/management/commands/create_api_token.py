from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions.models import ApiToken, Team


class Command(BaseCommand):
    help = "Create an API token for a team and print it (alone, on the last line)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("team", help="the team's slug")
        parser.add_argument("--name", default="api", help="a name to recognise the token by")

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            slugs = ", ".join(Team.objects.values_list("slug", flat=True)) or "none yet"
            raise CommandError(f"no team with slug {options['team']!r} (teams: {slugs})")
        token, key = ApiToken.issue(team, options["name"])
        self.stderr.write(f"Token {token.name!r} for team {team.slug} (shown once, store it now):")
        self.stdout.write(key)
