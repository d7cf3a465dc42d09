"""The reviewer's working surface in Chromium (issue 19): the whole row opens its approval as a
real link, times are in the reviewer's time zone, the keyboard, "& next", and a bulk decision
racing a colleague's."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.integration.browser.conftest import log_in, start_invoice, wait_live
from tests.integration.processes import Server, Site

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ZONE = "America/New_York"


def reviewer_in(browser: Browser, base_url: str, zone: str) -> Page:
    context = browser.new_context(
        base_url=base_url, timezone_id=zone, viewport={"width": 1200, "height": 720}
    )
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", "reviewer1")
    page.fill("#id_password", "reviewer1-demo")
    page.click("button[type=submit]")
    wait_live(page)
    return page


def test_a_click_anywhere_on_a_row_opens_it_and_a_middle_click_opens_a_tab(
    site: Site, browser: Browser
) -> None:
    server = site.serve()
    page = reviewer_in(browser, server.url, ZONE)
    interrupt_id = start_invoice(server, site.token, "ROW-1")
    row = page.locator(f"#interrupt-{interrupt_id}")
    expect(row).to_be_visible()

    def centre(cell: int) -> tuple[float, float]:
        box = row.locator("td").nth(cell).bounding_box()
        assert box is not None
        return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

    # Where a reviewer clicks, whatever is on top there (the title's link, stretched over the row).
    with page.context.expect_page() as opened:
        page.mouse.click(*centre(2), button="middle")  # the team's cell
    tab = opened.value
    tab.wait_for_load_state()
    assert tab.url.endswith(f"/interrupts/{interrupt_id}/")
    tab.close()
    page.mouse.click(*centre(3))  # "started by"
    page.wait_for_url(f"**/interrupts/{interrupt_id}/")


def local(at: str) -> str:
    return datetime.fromisoformat(at).astimezone(ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M")


def test_times_are_shown_in_the_reviewers_time_zone(site: Site, browser: Browser) -> None:
    server = site.serve()
    page = reviewer_in(browser, server.url, ZONE)
    interrupt_id = start_invoice(server, site.token, "TZ-1")
    # An age in the list ("just now"), the absolute time, local, on hover.
    expect(page.locator(f"#interrupt-{interrupt_id} time")).to_have_attribute(
        "title", re.compile(r"E[SD]T|GMT-[45]")
    )
    page.goto("/runs/")
    page.locator("table.inbox tbody a").first.click()
    started = page.locator("p.meta time")
    expect(started).to_have_text(local(started.get_attribute("datetime") or ""))
    expect(started).to_have_attribute("title", re.compile(r"E[SD]T|GMT-[45]"))


def run_of(server: Server, token: str, interrupt_id: int) -> dict[str, Any]:
    """The run that paused with ``interrupt_id``, as the API shows it (its transcript)."""
    with server.client(token) as api:
        listed = api.get("/api/interrupts").json()["items"]
        (run_id,) = [it["run_id"] for it in listed if it["id"] == interrupt_id]
        run: dict[str, Any] = api.get(f"/api/runs/{run_id}").json()
    return run


def test_a_reviewer_works_the_inbox_from_the_keyboard(site: Site, browser: Browser) -> None:
    server = site.serve()
    page = reviewer_in(browser, server.url, ZONE)
    oldest, middle, newest = (start_invoice(server, site.token, f"KEY-{n}") for n in (1, 2, 3))
    expect(page.locator("#inbox-rows > tr")).to_have_count(3)
    rows = {i: page.locator(f"#interrupt-{i}") for i in (oldest, middle, newest)}

    page.keyboard.press("j")  # the first row, the newest
    expect(rows[newest]).to_have_class(re.compile(r"\bcurrent\b"))
    expect(rows[newest].locator("a.message")).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("j")  # stays on the last
    expect(rows[oldest]).to_have_class(re.compile(r"\bcurrent\b"))
    page.keyboard.press("k")
    expect(rows[middle]).to_have_class(re.compile(r"\bcurrent\b"))
    expect(rows[oldest]).not_to_have_class(re.compile(r"\bcurrent\b"))

    page.keyboard.press("x")  # ticked for a bulk decision
    expect(rows[middle].locator("input[name=ids]")).to_be_checked()
    expect(page.locator("#bulk-selected")).to_have_text("1 selected")
    page.keyboard.press("x")
    expect(rows[middle].locator("input[name=ids]")).not_to_be_checked()

    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_visible()
    expect(page.locator("#keys-help")).to_contain_text("tick it for a bulk decision")
    page.keyboard.press("Escape")
    expect(page.locator("#keys-help")).to_be_hidden()

    # Keys typed into a field are text, not commands.
    page.locator("select[name=action]").focus()
    page.keyboard.press("j")
    expect(rows[middle]).to_have_class(re.compile(r"\bcurrent\b"))

    rows[middle].locator("a.message").focus()
    page.keyboard.press("o")
    page.wait_for_url(f"**/interrupts/{middle}/")
    page.keyboard.press("r")  # to the reason
    reason = page.locator("#id_reject-reason")
    expect(reason).to_be_focused()
    page.keyboard.type("a duplicate, rejected by keyboard")  # an "a" typed here approves nothing
    expect(reason).to_have_value("a duplicate, rejected by keyboard")
    assert run_of(server, site.token, middle)["status"] == "interrupted"
    page.locator("button.reject").click()
    expect(page.locator("p.decided")).to_contain_text("Already rejected by reviewer1")

    page.goto("/")
    wait_live(page)
    expect(page.locator("#inbox-rows > tr")).to_have_count(2)
    page.keyboard.press("j")
    page.keyboard.press("a")  # in the inbox: open it, ready to approve, nothing decided yet
    page.wait_for_url(f"**/interrupts/{newest}/#approve")
    expect(page.locator("form.approve-form button.approve")).to_be_focused()
    assert run_of(server, site.token, newest)["status"] == "interrupted"
    page.keyboard.press("a")  # on its page: approves
    expect(page.locator("p.decided")).to_contain_text("Already approved by reviewer1")
    run = run_of(server, site.token, newest)
    assert run["transcript"][0]["status"] == "approved"
    assert (
        run_of(server, site.token, middle)["transcript"][0]["reason"] == "a duplicate, rejected by keyboard"
    )


def test_approve_and_next_walks_the_inbox_and_says_when_it_is_done(site: Site, browser: Browser) -> None:
    server = site.serve()
    page = reviewer_in(browser, server.url, ZONE)
    first, second = (start_invoice(server, site.token, f"NEXT-{n}") for n in (1, 2))
    expect(page.locator("#inbox-rows > tr")).to_have_count(2)
    page.locator(f"#interrupt-{second} a.message").click()
    page.wait_for_url(f"**/interrupts/{second}/")
    page.locator("button.approve-next").click()
    page.wait_for_url(f"**/interrupts/{first}/")  # the next one, older, as the inbox lists them
    expect(page.locator("ul.messages")).to_contain_text("Approved “Approve sending the invoice?”")
    page.locator("details.reject summary").click()
    page.fill("#id_reject-reason", "not this month")
    page.locator("button.reject-next").click()
    page.wait_for_url(re.compile(r"/$"))
    expect(page.locator("ul.messages")).to_contain_text("That was the last one")
    expect(page.locator("#inbox-count")).to_have_text("0")
    assert run_of(server, site.token, second)["status"] != "interrupted"
    assert run_of(server, site.token, first)["status"] == "rejected"


def test_a_bulk_approval_racing_a_colleague_decides_each_once_and_names_who_won(
    site: Site, browser: Browser
) -> None:
    """The colleague approves one while the preview is open, before the confirm: the bulk loop
    then meets a decided interrupt. Two deciders at the same instant are the engine's conditional
    UPDATE (tests/test_engine.py, on SQLite and PostgreSQL); each bulk decision goes through it."""
    server = site.serve()
    page = reviewer_in(browser, server.url, ZONE)
    ids = [start_invoice(server, site.token, f"BULK-{n}") for n in (1, 2, 3)]
    expect(page.locator("#inbox-rows > tr")).to_have_count(3)
    newest, middle, oldest = ids[2], ids[1], ids[0]

    page.locator(f"#interrupt-{newest} input[name=ids]").click()
    page.locator(f"#interrupt-{oldest} input[name=ids]").click(modifiers=["Shift"])  # the range
    for i in ids:
        expect(page.locator(f"#interrupt-{i} input[name=ids]")).to_be_checked()
    expect(page.locator("#bulk-selected")).to_have_text("3 selected")
    page.locator("#bulk button[value=approve]").click()
    page.wait_for_url("**/bulk/?**")
    expect(page.locator("h1")).to_have_text("Approve 3 of 3 selected?")

    colleague = log_in(browser, server.url, "reviewer2")  # approves one while the preview is open
    colleague.goto(f"/interrupts/{middle}/")
    colleague.locator("form.approve-form button.approve").click()
    expect(colleague.locator("p.decided")).to_contain_text("Already approved by reviewer2")

    page.fill("#id_comment", "batch of the 3rd")
    page.locator("button.approve").click()
    expect(page.locator("h1")).to_have_text("Approved 2 of 3")
    expect(page.locator(f"#bulk-{newest} td.outcome")).to_contain_text("approved")
    expect(page.locator(f"#bulk-{middle} td.outcome")).to_contain_text(
        "Not approved: already approved by reviewer2"
    )
    for i in ids:
        decided = [e for e in run_of(server, site.token, i)["transcript"] if e["status"] == "approved"]
        assert len(decided) == 1, decided
    assert run_of(server, site.token, newest)["transcript"][0]["decided_by"] == "reviewer1"
    assert run_of(server, site.token, middle)["transcript"][0]["decided_by"] == "reviewer2"
    page.goto("/")
    expect(page.locator("#inbox-count")).to_have_text("0")


def test_a_comment_appears_live_for_a_colleague_viewing_it_and_keeps_what_they_type(
    site: Site, browser: Browser
) -> None:
    server = site.serve()
    interrupt_id = start_invoice(server, site.token, "TALK-1")
    mine = reviewer_in(browser, server.url, ZONE)
    theirs = log_in(browser, server.url, "reviewer2")
    for page in (mine, theirs):
        page.goto(f"/interrupts/{interrupt_id}/")
        wait_live(page)
    their_box = theirs.locator(f"#id_comment-body-{interrupt_id}")
    their_box.fill("half a thought")

    box = mine.locator(f"#id_comment-body-{interrupt_id}")
    box.fill("@reviewer2 is 1 EUR right for TALK-1?")
    mine.locator(".comment-form button").click()
    expect(mine.locator(f"#comment-list-{interrupt_id}")).to_contain_text("is 1 EUR right for TALK-1?")
    expect(box).to_have_value("")  # the form comes back empty
    expect(box).to_be_focused()  # so the next words typed are text: an "a" approves nothing
    mine.keyboard.type("and also")
    expect(box).to_have_value("and also")
    assert run_of(server, site.token, interrupt_id)["status"] == "interrupted"
    # Their page shows it without a reload, and what they were typing is still there.
    expect(theirs.locator(f"#comment-list-{interrupt_id}")).to_contain_text("is 1 EUR right for TALK-1?")
    expect(their_box).to_have_value("half a thought")
    expect(theirs.locator(f"#comment-list-{interrupt_id} li").first).to_contain_text("reviewer1")


def test_a_reviewer_edits_an_agents_tool_call_before_approving_it(site: Site, browser: Browser) -> None:
    server = site.serve()
    with server.client(site.token) as api:
        run = api.post(
            "/api/agents/runs",
            json={
                "messages": [{"role": "user", "content": "bill ACME"}],
                "tools": ["send_invoice"],
                "model": {
                    "scripted": [
                        {
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "name": "send_invoice",
                                    "arguments": {"invoice_id": "AG-1", "amount": 900},
                                }
                            ]
                        },
                        {"content": "billed"},
                    ]
                },
            },
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted", run
    page = reviewer_in(browser, server.url, ZONE)
    page.goto(f"/interrupts/{run['interrupt']['id']}/")
    page.locator("details.edit-call summary").click()
    expect(page.locator("#id_edit-amount")).to_have_value("900")
    page.fill("#id_edit-amount", "90")
    page.locator("form.approve-form button.approve").click()
    expect(page.locator("p.decided")).to_contain_text("Already approved by reviewer1")
    with server.client(site.token) as api:
        done = api.get(f"/api/agents/runs/{run['id']}").json()
    assert done["status"] == "completed", done
    assert done["transcript"][0]["edited_arguments"] == {"invoice_id": "AG-1", "amount": 90.0}
    called = done["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(called) == {"invoice_id": "AG-1", "amount": 90.0}  # what the model saw
