"""SCIM 2.0 provisioning at /scim/v2/: the python-scim project's conformance checker
(scim2-tester) passes against it, and what the directory writes reaches the site: its users are
users here, its groups open the teams the admin mapped them to, and a user it deactivates or
deletes is signed out and leaves nothing open. Authenticated by a token with the scim scope,
which only staff make."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from django.test import Client
from scim2_client.engines.wsgi import WSGISCIMClient
from scim2_tester import Status, check_server

from actions import engine
from actions.models import ApiToken, Grant, Membership, Role, Run, Scope, SignInGroup, Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database")]

BASE = "http://testserver/scim/v2"


@pytest.fixture
def scim_key(team: Team) -> str:
    return ApiToken.issue(team, "directory", [Scope.SCIM])[1]


def scim(key: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {key}"})


def post(client: Client, path: str, body: dict[str, Any]) -> Any:
    return client.post(f"/scim/v2/{path}", body, content_type="application/scim+json")


def patch(client: Client, path: str, *operations: dict[str, Any]) -> Any:
    body = {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"], "Operations": list(operations)}
    return client.patch(f"/scim/v2/{path}", body, content_type="application/scim+json")


@pytest.fixture
def site_wsgi() -> Iterator[WSGIHandler]:
    """The site's WSGI application, in this test's transaction: as Django's test client does,
    the database connection is not closed at the start and the end of each request."""
    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        for signal in (signals.request_started, signals.request_finished):
            signal.connect(close_old_connections)


def test_scim2_tester_finds_the_server_conformant(scim_key: str, site_wsgi: WSGIHandler) -> None:
    client = WSGISCIMClient(site_wsgi, base_url=BASE, headers={"Authorization": f"Bearer {scim_key}"})
    client.discover()
    results = check_server(client)
    failed = [f"{r.title}: {r.reason}" for r in results if r.status not in (Status.SUCCESS, Status.SKIPPED)]
    assert not failed, "\n".join(failed)
    assert sum(r.status == Status.SUCCESS for r in results) > 100  # discovery, CRUD, PATCH of each


def test_the_directorys_users_and_groups_make_the_sites_people_and_their_teams(
    team: Team, scim_key: str
) -> None:
    SignInGroup.objects.create(group="finance-approvers", team=team, role=Role.APPROVER)
    client = scim(scim_key)
    made = post(
        client,
        "Users",
        {
            "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
            "userName": "alice@example.com",
            "name": {"givenName": "Alice", "familyName": "Liddell"},
            "emails": [{"value": "alice@example.com", "primary": True}],
            "active": True,
            "password": "never-kept",
        },
    )
    assert made.status_code == 201, made.content
    alice_id = made.json()["id"]
    alice = User.objects.get(username="alice@example.com")
    assert (alice.email, alice.first_name, alice.last_name, alice.is_active) == (
        "alice@example.com",
        "Alice",
        "Liddell",
        True,
    )
    assert "never-kept" not in str(alice.directory_resource.payload)
    assert not Membership.objects.filter(user=alice).exists()

    group = post(
        client,
        "Groups",
        {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"], "displayName": "finance-approvers"},
    )
    assert group.status_code == 201, group.content
    group_id = group.json()["id"]
    added = patch(
        client, f"Groups/{group_id}", {"op": "add", "path": "members", "value": [{"value": alice_id}]}
    )
    assert added.status_code in (200, 204), added.content
    assert Membership.objects.get(user=alice, team=team).role == Role.APPROVER

    removed = patch(client, f"Groups/{group_id}", {"op": "remove", "path": f'members[value eq "{alice_id}"]'})
    assert removed.status_code in (200, 204), removed.content
    assert not Membership.objects.filter(user=alice, team=team).exists()

    # A userName that is another account's here: refused, nothing made.
    User.objects.create_user("bob")
    taken = post(
        client, "Users", {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "bob"}
    )
    assert taken.status_code == 201  # an account made before provisioning is taken over, not doubled
    assert (
        User.objects.filter(username="bob").count() == 1
        and User.objects.get(username="bob").directory_resource
    )
    bad = post(
        client, "Users", {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "a b"}
    )
    assert bad.status_code == 400 and not User.objects.filter(username="a b").exists()


def test_deactivated_in_the_directory_a_user_is_signed_out_and_leaves_nothing_open(
    team: Team, scim_key: str
) -> None:
    client = scim(scim_key)
    made = post(
        client, "Users", {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "gina"}
    )
    gina_id = made.json()["id"]
    gina = User.objects.get(username="gina")
    Membership.objects.create(team=team, user=gina, role=Role.APPROVER)
    requester = User.objects.create_user("rex")
    Membership.objects.create(team=team, user=requester, role=Role.APPROVER)
    run = engine.start_run(
        "send_invoice", {"invoice_id": "INV-3", "amount": 5}, team, requester, Run.Consumer.API
    )
    engine.approve(run.interrupts.get(), {"approved": True}, gina, grant=engine.GrantAsked("hour"))
    browser = Client()
    browser.force_login(gina)
    assert browser.get("/").status_code == 200

    off = patch(client, f"Users/{gina_id}", {"op": "replace", "path": "active", "value": False})
    assert off.status_code in (200, 204), off.content
    gina.refresh_from_db()
    assert not gina.is_active
    assert browser.get("/").status_code == 302  # signed out
    assert Grant.objects.get(granted_by=gina).revoked_at is not None

    assert client.delete(f"/scim/v2/Users/{gina_id}").status_code == 204
    assert client.get(f"/scim/v2/Users/{gina_id}").status_code == 404
    assert User.objects.filter(username="gina", is_active=False).exists()  # kept: the audit names her


def test_only_a_token_with_the_scim_scope_made_by_staff_provisions(team: Team, token_key: str) -> None:
    assert Client().get("/scim/v2/ServiceProviderConfig").status_code == 200  # open, as RFC 7643 says
    assert Client().get("/scim/v2/Users").status_code == 401
    refused = scim(token_key).get("/scim/v2/Users")  # a team's token, every scope of a team's
    assert refused.status_code == 403 and "scope scim" in refused.json()["detail"]
    admin = User.objects.create_user("ada")
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    with pytest.raises(engine.NotAllowed, match="Only staff make tokens with the scim scope"):
        engine.tokens.issue(team, "dir", [Scope.SCIM], None, admin)
    staff = User.objects.create_user("root", is_staff=True)
    assert engine.tokens.issue(team, "dir", [Scope.SCIM], None, staff)[0].scopes == ["scim"]


def test_the_directory_takes_over_no_staff_or_disabled_account_and_no_look_alike(scim_key: str) -> None:
    client = scim(scim_key)
    user = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"]}
    User.objects.create_user("root", is_staff=True)
    User.objects.create_user("gone", is_active=False)
    for name in ("root", "ROOT", "gone"):
        refused = post(client, "Users", {**user, "userName": name})
        assert refused.status_code == 409, (name, refused.content)
    assert User.objects.get(username="root").is_staff and not User.objects.get(username="gone").is_active
    assert post(client, "Users", {**user, "userName": "root\n"}).status_code == 400  # no look-alike
    assert (
        post(client, "Users", {**user, "userName": "eve", "emails": [{"value": "not-mail"}]}).status_code
        == 400
    )
    assert not User.objects.filter(username__startswith="eve").exists()


def test_active_follows_the_directory_but_not_over_an_admins_disabling(team: Team, scim_key: str) -> None:
    SignInGroup.objects.create(group="finance", team=team, role=Role.APPROVER)
    client = scim(scim_key)
    user = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "kim"}
    kim_id = post(client, "Users", user).json()["id"]
    group = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"], "displayName": "finance"}
    group_id = post(client, "Groups", {**group, "members": [{"value": kim_id}]}).json()["id"]
    kim = User.objects.get(username="kim")
    assert Membership.objects.get(user=kim, team=team).role == Role.APPROVER
    # A replacement that leaves active out changes nothing; the directory disables...
    assert (
        client.put(f"/scim/v2/Users/{kim_id}", user, content_type="application/scim+json").status_code == 200
    )
    kim.refresh_from_db()
    assert kim.is_active
    patch(client, f"Users/{kim_id}", {"op": "replace", "path": "active", "value": False})
    kim.refresh_from_db()
    assert not kim.is_active and not Membership.objects.filter(user=kim).exists()  # and they leave
    # ...and re-enables what it disabled, with the teams its groups give.
    patch(client, f"Users/{kim_id}", {"op": "replace", "path": "active", "value": True})
    kim.refresh_from_db()
    assert kim.is_active and Membership.objects.get(user=kim, team=team).role == Role.APPROVER
    # An account an admin disabled here stays disabled, whatever the directory sends.
    kim.is_active = False
    kim.save()
    client.put(f"/scim/v2/Users/{kim_id}", {**user, "active": True}, content_type="application/scim+json")
    kim.refresh_from_db()
    assert not kim.is_active
    assert client.get(f"/scim/v2/Groups/{group_id}").status_code == 200


def test_a_directory_made_account_is_the_one_its_person_signs_in_with(scim_key: str, settings: Any) -> None:
    from django.test import RequestFactory

    from actions.web import sso

    post(
        scim(scim_key),
        "Users",
        {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "alice@example.com"},
    )
    settings.GRUNDLAG_OIDC_ISSUER = "https://idp.example.com"
    backend = sso.SignInBackend()
    backend.request = RequestFactory().get("/oidc/callback/")
    # A name a person may choose, or an email not verified, claims nothing...
    for claims in (
        {"sub": "00u9", "preferred_username": "alice@example.com"},
        {"sub": "00u9", "email": "alice@example.com", "email_verified": False},
    ):
        assert not backend.filter_users_by_claims(claims).exists()
    # ...their verified email does.
    (found,) = backend.filter_users_by_claims(
        {"sub": "00u1", "email": "alice@example.com", "email_verified": True}
    )
    assert found.username == "alice@example.com" and found.sign_in_identity.subject == "00u1"
    assert User.objects.filter(username__startswith="alice").count() == 1


def test_a_renamed_directory_user_keeps_the_username_assignments_name(team: Team, scim_key: str) -> None:
    client = scim(scim_key)
    user = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "kim"}
    kim_id = post(client, "Users", user).json()["id"]
    renamed = patch(client, f"Users/{kim_id}", {"op": "replace", "path": "userName", "value": "kim.lee"})
    assert renamed.status_code in (200, 204), renamed.content
    assert client.get(f"/scim/v2/Users/{kim_id}").json()["userName"] == "kim.lee"  # the directory's
    assert User.objects.filter(username="kim").exists()  # here, as assignments name them


def test_a_team_whose_members_come_from_the_directory_shows_them_to_read(team: Team) -> None:
    SignInGroup.objects.create(group="finance", team=team, role=Role.APPROVER)
    admin = User.objects.create_user("ada")
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    client = Client()
    client.force_login(admin)
    page = client.get("/teams/finance/").content.decode()
    assert "come from the company's identity provider or directory" in page
    assert "Add a member" not in page and "Remove" not in page
