"""Single sign-on in Chromium against a real OpenID Connect provider (django-oauth-toolkit, in a
process of its own: tests/integration/oidc_provider): the first sign-in makes the user, in the
team and role their group maps to; a group changed at the provider applies at the next sign-in;
logging out ends the session here and at the provider; a token for another application, an
expired token and a person of no known group are refused, saying why. Password sign-in off:
no password is taken, and staff sign in with a link made on the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.integration.processes import OidcProvider, Server, Site, free_port

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[OidcProvider]:
    idp = OidcProvider(tmp_path / "idp")
    idp.directory.mkdir()
    yield idp
    idp.stop()


def serve_with(site: Site, provider: OidcProvider, **env: str) -> Server:
    port = free_port()
    provider.start(
        f"http://127.0.0.1:{port}",
        "alice:finance-approvers,newsletter",
        "wrong-audience:finance-approvers",
        "expired:finance-approvers",
        "bob:marketing",
    )
    site.env.update(provider.site_env(**env))
    # The admin's mapping: the provider's groups to the demo team's roles.
    (demo,) = site.sql("SELECT id FROM actions_team WHERE slug = 'demo'")[0]
    for group, role in (("finance-approvers", "approver"), ("finance-admins", "admin")):
        site.sql(
            'INSERT INTO actions_signingroup ("group", team_id, role) VALUES (%s, %s, %s)', group, demo, role
        )
    return site.serve(port)


def sign_in(browser: Browser, server: Server, username: str) -> Page:
    page = browser.new_context(base_url=server.url).new_page()
    page.goto("/login/")
    page.locator("#sign-in-with").click()
    page.wait_for_url("**/accounts/login/**")  # at the provider
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.locator("#idp-sign-in").click()
    return page


def role_of(site: Site, username: str) -> list[tuple[str, str]]:
    return site.sql(
        "SELECT t.slug, m.role FROM actions_team_members m JOIN actions_team t ON t.id = m.team_id"
        " JOIN auth_user u ON u.id = m.user_id WHERE u.username = %s ORDER BY t.slug",
        username,
    )


def test_sign_in_makes_the_user_in_their_teams_follows_group_changes_and_logs_out_at_the_provider(
    site: Site, provider: OidcProvider, browser: Browser
) -> None:
    server = serve_with(site, provider)
    try:
        page = sign_in(browser, server, "alice")
        page.wait_for_url(f"{server.url}/")
        expect(page.locator(".signed-in")).to_contain_text("alice")
        assert role_of(site, "alice") == [("demo", "approver")]
        assert site.sql("SELECT COUNT(*) FROM actions_signinidentity")[0][0] == 1

        # The provider moves her to the admins: she is an admin here from her next sign-in.
        provider.set_users("alice:finance-admins")
        page.locator("form.logout button").click()
        page.wait_for_url(f"{server.url}/login/")  # back from the provider's end of the session
        page.goto("/")
        page.wait_for_url(f"{server.url}/login/?next=/")  # signed out here
        page.locator("#sign-in-with").click()
        page.wait_for_url("**/accounts/login/**")  # and there: the provider asks again
        page.fill("#id_username", "alice")
        page.fill("#id_password", "pw-alice")
        page.locator("#idp-sign-in").click()
        page.wait_for_url(f"{server.url}/")
        assert role_of(site, "alice") == [("demo", "admin")]
        page.goto("/teams/demo/")
        expect(page.locator("#members")).to_contain_text("alice")
        expect(page.locator("#members")).to_contain_text("admin")
        # Its members come from the provider: shown to read, even to its admins.
        expect(page.locator(".notice")).to_contain_text("come from the company's identity provider")
        assert site.sql("SELECT COUNT(*) FROM auth_user WHERE username LIKE 'alice%%'")[0][0] == 1

        for username, why in (
            ("wrong-audience", "the ID token is for another application (its audience)"),
            ("expired", "the identity provider's ID token has expired"),
            ("bob", "your account is in no group that opens a team here (your groups: marketing)"),
        ):
            refused = sign_in(browser, server, username)
            refused.wait_for_url(f"{server.url}/oidc/callback/**")
            expect(refused.locator("#sign-in-refused")).to_contain_text(why)
            assert site.sql("SELECT COUNT(*) FROM auth_user WHERE username = %s", username)[0][0] == 0
            refused.goto("/")
            refused.wait_for_url(f"{server.url}/login/?next=/")
    except BaseException:
        print(provider.logs())
        print("PAGE", page.url, page.content()[:3000])
        raise


def test_with_password_sign_in_off_no_password_is_taken_and_staff_sign_in_with_a_link(
    site: Site, provider: OidcProvider, browser: Browser
) -> None:
    server = serve_with(site, provider, GRUNDLAG_PASSWORD_LOGIN="false")
    page = browser.new_context(base_url=server.url).new_page()
    page.goto("/login/")
    expect(page.locator("#sign-in-with")).to_have_text("Sign in with Test IdP")
    expect(page.locator("#id_password")).to_have_count(0)
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    posted = page.request.post(
        "/login/",
        form={"username": "reviewer1", "password": "reviewer1-demo", "csrfmiddlewaretoken": csrf},
        headers={"Referer": f"{server.url}/login/"},
        max_redirects=0,
    )
    assert posted.status == 403 and "password sign-in is off here" in posted.text()

    link = site.manage("signin_link", "auditor").strip().splitlines()[-1]
    path = link[link.index("/login/link/") :]
    page.goto(path)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{server.url}/")
    expect(page.locator(".signed-in")).to_contain_text("auditor")
    # Once: the same link does nothing more.
    again = browser.new_context(base_url=server.url).new_page()
    again.goto(path)
    expect(again.locator("#sign-in-refused")).to_contain_text("has been used")
