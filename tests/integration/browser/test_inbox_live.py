"""Two reviewers of one team and a reviewer of another, in Chromium, against `manage.py serve`."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Request, expect

from tests.integration.browser.conftest import collect_dialogs, log_in, start_invoice, wait_live
from tests.integration.processes import Site, stop

pytestmark = [pytest.mark.browser, pytest.mark.integration]

XSS = '<img src=x onerror="alert(document.domain)"><script>alert(1)</script>'


def screenshot_dir(tmp_path: Path) -> Path:
    # `make screenshots` sets this to docs/ to refresh the README's pictures.
    return Path(os.environ.get("GRUNDLAG_SCREENSHOTS", tmp_path))


def test_reviewers_see_a_new_approval_live_and_one_decision_clears_it_everywhere(
    site: Site, browser: Browser, tmp_path: Path
) -> None:
    site.manage("migrate", "--noinput", "-v0")
    token = site.manage("seed_demo").strip().splitlines()[-1].split(": ")[-1]
    server = site.serve()

    reviewer1 = log_in(browser, server.url, "reviewer1")
    reviewer2 = log_in(browser, server.url, "reviewer2")
    payroll = log_in(browser, server.url, "payroll1")
    dialogs = [collect_dialogs(page) for page in (reviewer1, reviewer2, payroll)]
    # The demo runs `make run` seeds (five actions, an agent and a service's approval) wait.
    expect(reviewer1.locator("#inbox tbody tr")).to_have_count(7)
    expect(reviewer2).to_have_title("(7) Inbox · Grundlag approvals")
    # The demo's deadline policy (timeuntil separates with no-break spaces).
    expect(reviewer1.locator("#inbox")).to_contain_text(re.compile(r"expires in 7\shours"))
    reviewer1.screenshot(path=str(screenshot_dir(tmp_path) / "inbox.png"))
    # The same inbox on a phone, in dark mode: cards, not a table.
    phone = browser.new_context(
        base_url=server.url,
        viewport={"width": 390, "height": 844},
        color_scheme="dark",
        device_scale_factor=2,
    ).new_page()
    phone.goto("/login/")
    phone.fill("#id_username", "reviewer2")
    phone.fill("#id_password", "reviewer2-demo")
    phone.click("button[type=submit]")
    expect(phone.locator("#inbox tbody tr")).to_have_count(7)
    phone.screenshot(path=str(screenshot_dir(tmp_path) / "phone.png"))
    phone.context.close()

    with server.client(token) as api:
        run = api.post(
            "/api/runs",
            json={"action": "delete_customer_data", "input": {"customer_id": "cus_77", "requested_by": XSS}},
            headers={"Prefer": "wait=20"},
        ).json()
    interrupt_id = run["interrupt"]["id"]
    row = f"#interrupt-{interrupt_id}"

    # It appears for both reviewers of the team without a reload...
    expect(reviewer1.locator(row)).to_be_visible()
    expect(reviewer2.locator(row)).to_be_visible()
    expect(reviewer2).to_have_title("(8) Inbox · Grundlag approvals")
    # ...and reviewer2 also has it open, about to decide.
    reviewer2_detail = reviewer2.context.new_page()
    reviewer2_detail.goto(f"/interrupts/{interrupt_id}/")
    expect(reviewer2_detail.locator("#live")).to_have_attribute("data-state", "live")
    expect(reviewer2_detail.locator("button.approve")).to_be_visible()

    # ...and has the run's page open in a third tab, to watch it finish.
    reviewer2_run = reviewer2.context.new_page()
    reviewer2_run.goto(f"/runs/{run['id']}/")
    expect(reviewer2_run.locator("#live")).to_have_attribute("data-state", "live")
    expect(reviewer2_run.locator("#run-status")).to_have_text("interrupted")

    reviewer1.click(f"{row} a.message")
    expect(reviewer1.locator("h1")).to_contain_text("Delete data of customer cus_77")
    expect(reviewer1.locator("main")).to_contain_text(XSS)  # shown as text, not markup
    reviewer1.fill("#id_answer-confirm_customer_id", "cus_77")
    reviewer1.select_option("#id_answer-scope", "everything")
    reviewer1.fill("#id_answer-ticket", "SEC-42")
    reviewer1.screenshot(path=str(screenshot_dir(tmp_path) / "decision.png"), full_page=True)
    reviewer1.click("button.approve")
    expect(reviewer1.locator(f"#decision-{interrupt_id}")).to_contain_text("Already approved by reviewer1")

    # Gone from reviewer2's inbox, and the open page says who decided instead of offering a form.
    expect(reviewer2.locator(row)).to_have_count(0)
    expect(reviewer2).to_have_title("(7) Inbox · Grundlag approvals")
    expect(reviewer2_detail.locator(f"#decision-{interrupt_id}")).to_contain_text(
        "Already approved by reviewer1"
    )
    expect(reviewer2_detail.locator("button.approve")).to_have_count(0)

    with server.client(token) as api:
        deadline = time.monotonic() + 20
        while (detail := api.get(f"/api/runs/{run['id']}").json())["status"] != "completed":
            assert time.monotonic() < deadline, detail
            time.sleep(0.1)
    assert detail["output"] == {"deleted": "cus_77", "scope": "everything", "ticket": "SEC-42"}
    assert detail["transcript"][0]["decided_by"] == "reviewer1"

    # The open run page followed the run to its end without a reload.
    expect(reviewer2_run.locator("#run-status")).to_have_text("completed")
    expect(reviewer2_run.locator("ol.timeline")).to_contain_text("Approved by reviewer1")

    # The run page shows the transcript.
    reviewer1.goto(f"/runs/{run['id']}/")
    expect(reviewer1.locator("#run-status")).to_have_text("completed")
    expect(reviewer1.locator("ol.timeline")).to_contain_text("Approved by reviewer1")

    # The other team never saw it, and cannot open it.
    expect(payroll.locator("#inbox tbody tr")).to_have_count(0)
    assert payroll.goto(f"/interrupts/{interrupt_id}/").status == 404  # type: ignore[union-attr]
    assert dialogs == [[], [], []], "no script from the payload ran"


def test_a_reviewer_whose_socket_dropped_catches_up_on_reconnect_without_reload(
    site: Site, browser: Browser
) -> None:
    server = site.serve()
    reviewer = log_in(browser, server.url, "reviewer1")
    expect(reviewer.locator("#inbox tbody tr")).to_have_count(0)
    reviewer.evaluate("window.notReloaded = true")

    stop(server.proc)
    expect(reviewer.locator("#live")).to_have_attribute("data-state", "reconnecting")
    # While the server is down, a run is queued; no push about it can reach the page.
    site.manage(
        "shell",
        "-c",
        "from actions import engine; from actions.models import Team; "
        "engine.start_run('send_invoice', {'invoice_id': 'MISSED-1', 'amount': 5}, "
        "Team.objects.get(slug='demo'), None)",
    )
    site.serve(port=server.port)

    expect(reviewer.locator("#live")).to_have_attribute("data-state", "live", timeout=30_000)
    expect(reviewer.locator("#inbox")).to_contain_text("MISSED-1", timeout=20_000)
    assert reviewer.evaluate("window.notReloaded") is True


START_INVOICES = (
    "from actions import engine; from actions.models import Team; "
    "[engine.start_run('send_invoice', {{'invoice_id': 'OLD-%d' % i, 'amount': 5}}, "
    "Team.objects.get(slug='demo'), None) for i in range({count})]"
)
ISSUE_TOKEN = (
    "from actions.models import ApiToken, Team; "
    "print(ApiToken.issue(Team.objects.get(slug='{team}'), 'browser test')[1])"
)


def test_pushed_rows_are_applied_in_place_by_filter_and_a_missed_frame_is_refetched(
    site: Site, browser: Browser
) -> None:
    """The page applies each frame (the row rendered once by the server) without asking the
    server for its list; a filtered page leaves out what is not in its view; the count is of
    every pending interrupt, beyond the rows listed; a frame missed (its number skips one)
    makes the page fetch its list again."""
    site.manage("migrate", "--noinput", "-v0")
    site.manage("seed_demo")
    site.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; from actions.models import Team; "
        "Team.objects.get(slug='payroll').members.add(User.objects.get(username='reviewer2'))",
    )
    demo = site.manage("shell", "-c", ISSUE_TOKEN.format(team="demo")).split()[-1]
    payroll = site.manage("shell", "-c", ISSUE_TOKEN.format(team="payroll")).split()[-1]
    # Queued with the server down: it runs them as it starts.
    site.manage("shell", "-c", START_INVOICES.format(count=203))
    server = site.serve()

    everything = log_in(browser, server.url, "reviewer2")  # in both teams
    filtered = log_in(browser, server.url, "reviewer1")
    filtered.goto("/?action=transfer_funds")
    wait_live(filtered)
    pending = 203 + 7  # and the demo's seven
    # The server works the queued runs off as it starts; on a loaded machine (CI's two cores
    # shared with the browser) that outlasts an assertion's usual five seconds.
    expect(everything.locator("#inbox-count")).to_have_text(str(pending), timeout=60_000)
    expect(everything.locator("#inbox tbody tr")).to_have_count(200)
    expect(everything.locator("#inbox-shown")).to_contain_text("the newest 200 shown")
    expect(filtered.locator("#inbox tbody tr")).to_have_count(1)
    expect(filtered).to_have_title("(1) Inbox · Grundlag approvals")

    fetches: list[tuple[str, str]] = []

    def watch(name: str) -> Callable[[Request], None]:
        def record(request: Request) -> None:
            if request.resource_type in ("xhr", "fetch"):
                fetches.append((name, urlsplit(request.url).path))

        return record

    for page in (everything, filtered):
        page.wait_for_load_state("networkidle")  # the list fetched as the socket connected
    everything.evaluate("window.notReloaded = true")
    everything.on("request", watch("everything"))
    filtered.on("request", watch("filtered"))

    start_invoice(server, demo, "NEW-0")
    expect(everything.locator("#inbox tbody tr").first).to_contain_text("NEW-0")
    expect(everything.locator("#inbox-count")).to_have_text(str(pending + 1))
    expect(everything.locator("#inbox tbody tr")).to_have_count(200)
    # Another team's new approval, for the reviewer in both.
    start_invoice(server, payroll, "PAY-0")
    expect(everything.locator("#inbox tbody tr").first).to_contain_text("PAY-0")
    expect(everything.locator("#inbox-count")).to_have_text(str(pending + 2))
    # The filtered page's count and rows did not move.
    expect(filtered).to_have_title("(1) Inbox · Grundlag approvals")
    expect(filtered.locator("#inbox tbody tr")).to_have_count(1)
    assert fetches == [], "frames are applied in place, not by fetching the list"

    # A frame lost (as to a full channel): the team's stream moves on without one reaching pages.
    site.manage(
        "shell",
        "-c",
        "from actions.models import InboxStream, Team; from django.db.models import F; "
        "InboxStream.objects.filter(team=Team.objects.get(slug='demo')).update(seq=F('seq') + 1)",
    )
    start_invoice(server, demo, "AFTER-GAP-0")
    expect(everything.locator("#inbox tbody tr").first).to_contain_text("AFTER-GAP-0")
    expect(everything.locator("#inbox-count")).to_have_text(str(pending + 3))
    # Both pages saw the number skip one, and fetched their list again.
    assert ("everything", "/") in fetches and ("filtered", "/") in fetches
    expect(filtered.locator("#inbox tbody tr")).to_have_count(1)
    assert everything.evaluate("window.notReloaded") is True
