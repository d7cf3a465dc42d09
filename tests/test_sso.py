"""Single sign-on's parts that need no provider (the sign-in itself is tested in Chromium
against a real one: tests/integration/browser/test_sso.py): the groups a person has make their
memberships of the teams the provider manages, the strongest role winning; password sign-in can
be turned off; staff sign in once with a link made on the server."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from actions import engine
from actions.models import Membership, Role, SignInGroup, Team
from actions.web import sso

pytestmark = pytest.mark.django_db


def test_groups_give_the_strongest_role_and_end_memberships_only_in_the_teams_the_provider_manages(
    team: Team, other_team: Team
) -> None:
    elsewhere = Team.objects.create(name="Legal", slug="legal")  # no sign-in group: not the provider's
    SignInGroup.objects.create(group="fin-view", team=team, role=Role.VIEWER)
    SignInGroup.objects.create(group="fin-admin", team=team, role=Role.ADMIN)
    SignInGroup.objects.create(group="payroll", team=other_team, role=Role.AUDITOR)
    claims = {"sub": "1", "groups": ["fin-view", "fin-admin", "unknown"]}
    roles, managed = sso._roles_of(claims)  # noqa: SLF001 - the mapping, apart from the sign-in
    assert roles == {team.pk: Role.ADMIN} and managed == {team.pk, other_team.pk}

    user = User.objects.create_user("alice")
    Membership.objects.create(team=other_team, user=user, role=Role.APPROVER)
    Membership.objects.create(team=elsewhere, user=user, role=Role.VIEWER)
    engine.members.from_groups(user, roles, managed)
    assert dict(Membership.objects.filter(user=user).values_list("team__slug", "role")) == {
        "finance": Role.ADMIN,  # the strongest of her groups'
        "legal": Role.VIEWER,  # not the provider's to change
    }
    assert sso._roles_of({"sub": "1", "groups": "payroll"})[0] == {other_team.pk: Role.AUDITOR}  # noqa: SLF001


def test_usernames_come_from_the_claims_and_never_take_anothers(db: Any) -> None:
    User.objects.create_user("alice")
    assert sso._free_username({"preferred_username": "alice"}) == "alice-2"  # noqa: SLF001
    assert sso._free_username({"email": "bob.b@example.com"}) == "bob.b"  # noqa: SLF001
    assert sso._free_username({"preferred_username": "<script>"}) == "script"  # noqa: SLF001
    assert sso._free_username({"preferred_username": "\u0430lice"}) == "lice"  # noqa: SLF001 - no look-alike


def test_with_password_sign_in_off_a_password_is_refused_whoever_sends_it(
    reviewer: User, settings: Any
) -> None:
    settings.GRUNDLAG_PASSWORD_LOGIN = False
    client = Client()
    page = client.get("/login/").content.decode()
    assert 'name="password"' not in page
    refused = client.post("/login/", {"username": "reviewer1", "password": "pw-reviewer1"})
    assert refused.status_code == 403 and "password sign-in is off here" in refused.content.decode()
    assert "_auth_user_id" not in client.session


def test_staff_sign_in_once_with_a_link_made_on_the_server(db: Any, capsys: Any) -> None:
    staff = User.objects.create_user("root", is_staff=True)
    User.objects.create_user("plain")
    with pytest.raises(CommandError, match="not an active staff user"):
        call_command("signin_link", "plain")
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("signin_link", "ghost")
    call_command("signin_link", "root")
    path = re.search(r"(/login/link/[^/\s]+/)", capsys.readouterr().out)
    assert path
    client = Client()
    assert "Sign in as root" in client.get(path.group(1)).content.decode()  # a GET signs nobody in
    assert "_auth_user_id" not in client.session
    assert client.post(path.group(1)).status_code == 302
    assert client.session["_auth_user_id"] == str(staff.pk)
    again = Client().post(path.group(1))
    assert again.status_code == 403 and "has been used" in again.content.decode()
    forged = Client().get(path.group(1)[:-3] + "x/")
    assert forged.status_code == 403


def test_who_is_let_in_where_groups_are_mapped_and_where_none_is(team: Team, settings: Any) -> None:
    from django.test import RequestFactory

    settings.GRUNDLAG_OIDC_ISSUER = "https://idp.example.com"
    backend = sso.SignInBackend()
    backend.request = RequestFactory().get("/oidc/callback/")
    # No sign-in group at all: nobody gets in by the provider alone (it may accept anyone)...
    with pytest.raises(sso.Refused, match="in no group that opens a team here"):
        backend.create_user({"sub": "z1", "preferred_username": "zed", "groups": ["anything"]})
    # ...unless the site opens its sign-up: then in no team, for a Team page to add them.
    settings.GRUNDLAG_OIDC_OPEN_SIGN_UP = True
    zed = backend.create_user({"sub": "z1", "preferred_username": "zed", "groups": ["anything"]})
    assert zed.sign_in_identity.subject == "z1" and not Membership.objects.filter(user=zed).exists()
    # Groups mapped: someone they put in no team is refused, and no user is made.
    SignInGroup.objects.create(group="finance", team=team, role=Role.VIEWER)
    with pytest.raises(sso.Refused, match="in no group that opens a team here"):
        backend.create_user({"sub": "y1", "preferred_username": "yan", "groups": ["sales"]})
    assert not User.objects.filter(username="yan").exists()
    # Unless a team's admin put them in a team the provider does not manage.
    with pytest.raises(sso.Refused):
        backend.update_user(zed, {"sub": "z1", "groups": []})
    legal = Team.objects.create(name="Legal", slug="legal")
    Membership.objects.create(team=legal, user=zed, role=Role.VIEWER)
    assert backend.update_user(zed, {"sub": "z1", "groups": []}) == zed
    # Refused or not, they leave the teams their groups no longer open (mail links need no session).
    backend.update_user(zed, {"sub": "z1", "groups": ["finance"]})
    assert Membership.has(zed.pk, [team.pk], Role.READ)
    Membership.objects.filter(user=zed, team=legal).delete()
    with pytest.raises(sso.Refused):
        backend.update_user(zed, {"sub": "z1", "groups": []})
    assert not Membership.objects.filter(user=zed).exists()
    zed.is_active = False
    with pytest.raises(sso.Refused, match="disabled"):
        backend.update_user(zed, {"sub": "z1", "groups": ["finance"]})
    # An email the provider says is not verified is not taken (mail and Slack find people by it).
    assert sso._email({"email": "ceo@example.com", "email_verified": False}) == ""  # noqa: SLF001


def test_a_disabled_account_is_signed_out_and_its_absences_and_grants_end(team: Team) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from actions.models import Delegation, Grant, Run

    gina = User.objects.create_user("gina")
    Membership.objects.create(team=team, user=gina, role=Role.APPROVER)
    cover = User.objects.create_user("cover")
    Membership.objects.create(team=team, user=cover, role=Role.APPROVER)
    requester = User.objects.create_user("rex")
    Membership.objects.create(team=team, user=requester, role=Role.APPROVER)
    run = engine.start_run(
        "send_invoice", {"invoice_id": "INV-9", "amount": 5}, team, requester, Run.Consumer.API
    )
    engine.approve(run.interrupts.get(), {"approved": True}, gina, grant=engine.GrantAsked("hour"))
    away = engine.set_away(gina, cover, timezone.now(), timezone.now() + timedelta(days=3))
    client = Client()
    client.force_login(gina, backend="actions.web.sso.SignInBackend")  # signed in with the provider
    assert client.get("/").status_code == 200

    gina.is_active = False
    gina.save()  # the admin's "active" box, or the directory's provisioning

    assert client.get("/").status_code == 302  # signed out at the next request
    assert Delegation.objects.get(pk=away.pk).ends_at <= timezone.now()
    (grant,) = Grant.objects.filter(granted_by=gina)
    assert grant.revoked_at is not None and grant.revoked_by_name == "account disabled"
    again = engine.start_run(
        "send_invoice", {"invoice_id": "INV-9", "amount": 5}, team, requester, Run.Consumer.API
    )
    assert again.interrupts.get().status == "pending"  # the grant approves nothing more
