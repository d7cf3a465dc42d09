"""Register the site as a client and make the test users (each ``user:group,group``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandParser
from oauth2_provider.models import Application


class Command(BaseCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--client-id", required=True)
        parser.add_argument("--client-secret", required=True)
        parser.add_argument("--site", required=True, help="the site's URL: its callback and logout return")
        parser.add_argument("users", nargs="*", help="username:group,group (password: pw-<username>)")

    def handle(self, *args: Any, **options: Any) -> None:
        site = options["site"].rstrip("/")
        Application.objects.update_or_create(
            client_id=options["client_id"],
            defaults={
                "name": "Grundlag",
                "client_secret": options["client_secret"],
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "redirect_uris": f"{site}/oidc/callback/",
                "post_logout_redirect_uris": f"{site}/login/",
                "algorithm": Application.RS256_ALGORITHM,
                "skip_authorization": True,
            },
        )
        for spec in options["users"]:
            self.set_groups(spec)

    def set_groups(self, spec: str) -> None:
        name, _, groups = spec.partition(":")
        user, made = User.objects.get_or_create(username=name, defaults={"email": f"{name}@example.com"})
        if made:
            user.set_password(f"pw-{name}")
            user.save()
        user.groups.set([Group.objects.get_or_create(name=group)[0] for group in groups.split(",") if group])
