from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions import engine
from actions.models import Role, Team


class Command(BaseCommand):
    help = (
        "Put a user in a team in a role, change their role, or (--remove) take them out: for"
        " automation (a provisioning script, a deploy). Acts as staff would: the team's last"
        " admin may be changed here."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("team", help="the team's slug")
        parser.add_argument("user", help="the user's username")
        action = parser.add_mutually_exclusive_group(required=True)
        action.add_argument("--role", choices=Role.values, help="the role they have in the team")
        action.add_argument("--remove", action="store_true", help="take them out of the team")

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            slugs = ", ".join(Team.objects.values_list("slug", flat=True)) or "none yet"
            raise CommandError(f"no team with slug {options['team']!r} (teams: {slugs})")
        users = get_user_model()
        user = users.objects.filter(**{users.USERNAME_FIELD: options["user"]}).first()
        if user is None:
            raise CommandError(f"no user named {options['user']!r}")
        try:
            if options["remove"]:
                change = engine.members.remove(team, user, None)
            else:
                change = engine.members.set_role(team, user, options["role"], None)
        except engine.EngineError as exc:
            raise CommandError(str(exc)) from exc
        name = user.get_username()
        if not change.changed:
            said = f"is {change.after} in" if change.after else "is not a member of"
            self.stdout.write(f"{name} {said} {team.slug} already: nothing changed")
        elif change.after is None:
            self.stdout.write(f"{name} is no longer a member of {team.slug} (was {change.before})")
        else:
            was = f" (was {change.before})" if change.before else " (new member)"
            self.stdout.write(f"{name} is {change.after} in {team.slug}{was}")
