"""The reviewer's working surface in Chromium (issue 19, in part): the whole row opens its
approval as a real link, and times are in the reviewer's time zone."""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.integration.browser.conftest import start_invoice, wait_live
from tests.integration.processes import Site

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
