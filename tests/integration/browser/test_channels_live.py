"""Reaching reviewers outside the tab, as deployed (`manage.py serve`): a mail through a real
SMTP server whose link is opened and answered in Chromium without signing in; Slack through a
local server speaking its Web API, answered by a signed button click; a desktop notification
for a new approval while the inbox tab is in the background."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.integration.browser.conftest import start_invoice, wait_live
from tests.integration.browser.test_accessibility import violations
from tests.integration.processes import Server, Site, free_port, wait_for
from tests.slack_server import SIGNING_SECRET, TOKEN, SlackServer, button, signed
from tests.smtp_server import Mailbox, html_of, text_of

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    mailbox = Mailbox()
    yield mailbox
    mailbox.stop()


@pytest.fixture
def slack() -> Iterator[SlackServer]:
    server = SlackServer()
    yield server
    server.stop()


def serve_with_channels(site: Site, mailbox: Mailbox, slack: SlackServer | None = None) -> Server:
    port = free_port()
    site.env.update(
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(mailbox.port),
        GRUNDLAG_BASE_URL=f"http://127.0.0.1:{port}",
    )
    if slack is not None:
        site.env.update(SLACK_BOT_TOKEN=TOKEN, SLACK_SIGNING_SECRET=SIGNING_SECRET, SLACK_API_URL=slack.url)
        site.manage(
            "shell",
            "-c",
            "from actions.models import Team, TeamChannels;"
            "TeamChannels.objects.create(team=Team.objects.get(slug='demo'), slack_channel='C0DEMO')",
        )
    return site.serve(port)


def start(server: Server, token: str, invoice_id: str) -> tuple[int, int]:
    """A run of send_invoice through the API, paused: its id and its interrupt's."""
    with server.client(token) as api:
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": invoice_id, "amount": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted", run
    return int(run["id"]), int(run["interrupt"]["id"])


def run_status(server: Server, token: str, run_id: int) -> str:
    with server.client(token) as api:
        return str(api.get(f"/api/runs/{run_id}").json()["status"])


def test_a_reviewer_decides_from_the_mail_link_without_signing_in(
    site: Site, browser: Browser, mailbox: Mailbox
) -> None:
    server = serve_with_channels(site, mailbox)
    run_id, _ = start(server, site.token, "MAIL-1")
    (message,) = wait_for(lambda: mailbox.to("reviewer1@example.com"), timeout=20, what="the mail")
    assert message["Subject"] == "[Grundlag approvals] Approval needed: Approve sending the invoice?"
    text, html = text_of(message), html_of(message)
    assert "invoice_id: MAIL-1" in text and "<dt>invoice_id</dt>" in html
    found = re.search(rf"{re.escape(server.url)}/d/\S+/", text)
    assert found and found.group(0) in html
    link = found.group(0)

    # A link previewer or scanner fetching it decides nothing.
    assert httpx.get(link).status_code == 200 and httpx.head(link).status_code == 200
    assert run_status(server, site.token, run_id) == "interrupted"

    # bypass_csp: for axe (the test's own script) on the page; the page's policy allows none.
    page = browser.new_context(bypass_csp=True).new_page()
    page.goto(link)
    expect(page.locator("h1")).to_have_text("Approve sending the invoice?")
    assert violations(page) == []  # serious or critical, as on every other page
    expect(page.get_by_text("Deciding as reviewer1")).to_be_visible()
    page.fill("#id_answer-comment", "from my phone")
    page.click("button.approve")
    expect(page.locator(".notice")).to_contain_text("Approved by you")
    wait_for(lambda: run_status(server, site.token, run_id) == "completed", timeout=20, what="the run")

    page.goto(link)  # used: says who decided, offers nothing
    expect(page.locator(".decided")).to_contain_text("Already approved by reviewer1")
    expect(page.locator("button.approve")).to_have_count(0)
    other = mailbox.to("reviewer2@example.com")[0]
    page.goto(re.search(r"http://\S+/d/\S+/", text_of(other)).group(0))  # type: ignore[union-attr]
    expect(page.locator(".decided")).to_contain_text("Already approved by reviewer1")


def test_a_reviewer_approves_from_slack_and_the_message_says_so(
    site: Site, mailbox: Mailbox, slack: SlackServer
) -> None:
    server = serve_with_channels(site, mailbox, slack)
    run_id, interrupt_id = start(server, site.token, "SLACK-1")
    (posted,) = wait_for(lambda: slack.called("chat.postMessage"), timeout=20, what="the Slack message")
    assert posted["channel"] == "C0DEMO" and "SLACK-1" in str(posted["blocks"])

    slack.add_user("U1", "reviewer1@example.com")
    body, headers = signed(button("grundlag_approve", interrupt_id, "U1", channel="C0DEMO"))
    forged = {**headers, "X-Slack-Signature": "v0=" + "0" * 64}
    url = f"{server.url}/slack/interactions"
    content_type = {"Content-Type": "application/x-www-form-urlencoded"}
    assert httpx.post(url, content=body, headers={**forged, **content_type}).status_code == 401
    assert httpx.post(url, content=body, headers={**headers, **content_type}).status_code == 200
    wait_for(lambda: run_status(server, site.token, run_id) == "completed", timeout=20, what="the run")
    (updated,) = wait_for(lambda: slack.called("chat.update"), timeout=20, what="the message updated")
    assert "*Approved* by reviewer1" in str(updated["blocks"])


def test_a_new_approval_shows_a_desktop_notification_while_the_tab_is_in_the_background(
    site: Site, browser: Browser, mailbox: Mailbox
) -> None:
    server = serve_with_channels(site, mailbox)
    context = browser.new_context(base_url=server.url)
    context.grant_permissions(["notifications"], origin=server.url)
    # The real Notification API, watched; and the tab made to look hidden, as a background tab is.
    context.add_init_script(
        """
        window.__shown = [];
        const Real = window.Notification;
        window.Notification = class extends Real {
          constructor(title, options) {
            super(title, options);
            window.__shown.push({title, body: options.body});
          }
        };
        Object.defineProperty(document, "hidden", {get: () => window.__hidden === true});
        """
    )
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", "reviewer1")
    page.fill("#id_password", "reviewer1-demo")
    page.click("button[type=submit]")
    wait_live(page)
    page.click("#browser-notifications")
    expect(page.locator("#browser-notifications")).to_have_text("Turn off notifications")

    start_invoice(server, site.token, "SEEN-1")  # while in front: no notification
    expect(page.locator("#inbox-count")).to_have_text("1")
    page.evaluate("window.__hidden = true")
    start_invoice(server, site.token, "NOTE-2")
    # Polled from here: the page's Content-Security-Policy forbids wait_for_function's eval.
    shown = wait_for(lambda: page.evaluate("window.__shown") or None, timeout=15, what="the notification")
    assert shown == [{"title": "New approval (2 waiting)", "body": "Approve sending the invoice?"}]
    assert page.title().startswith("(2) ")
