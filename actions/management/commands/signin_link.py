from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from actions.web import sso


class Command(BaseCommand):
    help = (
        "Print a link that signs a staff member in once, within 15 minutes: break-glass for when"
        " the identity provider is down or password sign-in is off (GRUNDLAG_PASSWORD_LOGIN=false)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the staff user's username")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        user = users.objects.filter(**{users.USERNAME_FIELD: options["user"]}).first()
        if user is None:
            raise CommandError(f"no user named {options['user']!r}")
        if not user.is_staff or not user.is_active:
            raise CommandError(f"{options['user']} is not an active staff user: links are for staff only")
        path = reverse("sign-in-link", args=[sso.sign_in_link_token(user)])
        self.stderr.write(f"A sign-in link for {user.get_username()}, usable once within 15 minutes:")
        self.stdout.write(f"{settings.GRUNDLAG_BASE_URL.rstrip('/')}{path}")
