"""Every page, in both colour schemes and on a phone (390 px): axe-core (vendored from npm,
loaded by this test only) finds no serious or critical violation, and nothing scrolls sideways
on the phone (issue 19)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.integration.browser.conftest import start_invoice, wait_live
from tests.integration.processes import Server, Site

pytestmark = [pytest.mark.browser, pytest.mark.integration]

AXE = Path(__file__).resolve().parents[3] / "static" / "vendor" / "axe-core" / "axe.min.js"
PHONE: ViewportSize = {"width": 390, "height": 844}
DESKTOP: ViewportSize = {"width": 1200, "height": 800}
Scheme = Literal["light", "dark"]


def signed_in(
    browser: Browser, server: Server, username: str, scheme: Scheme, viewport: ViewportSize
) -> Page:
    # bypass_csp: the page's policy allows scripts from the site only; axe is the test's own.
    context = browser.new_context(
        base_url=server.url,
        color_scheme=scheme,
        viewport=viewport,
        bypass_csp=True,
    )
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"{username}-demo")
    page.click("button[type=submit]")
    wait_live(page)
    return page


def violations(page: Page) -> list[dict[str, Any]]:
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.add_script_tag(content=AXE.read_text())
    found: list[dict[str, Any]] = page.evaluate(
        """async () => {
          const result = await axe.run(document, {resultTypes: ["violations"]});
          return result.violations.filter(v => v.impact === "serious" || v.impact === "critical")
            .map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3)
              .map(n => n.target.join(" ") + " :: " + n.failureSummary)}));
        }"""
    )
    return found


def sideways(page: Page) -> int:
    """How far the page scrolls sideways (0: it fits)."""
    return int(
        page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


def pages_to_check(server: Server, token: str) -> list[str]:
    interrupt_id = start_invoice(server, token, "A11Y-1")
    start_invoice(server, token, "A11Y-2")
    with server.client(token) as api:
        listed = api.get("/api/interrupts").json()["items"]
        run_id = next(it["run_id"] for it in listed if it["id"] == interrupt_id)
        # An agent's paused tool call: its page has the form that edits the call.
        agent_run = api.post(
            "/api/agents/runs",
            json={
                "messages": [{"role": "user", "content": "bill"}],
                "tools": ["send_invoice"],
                "model": {
                    "scripted": [
                        {
                            "tool_calls": [
                                {
                                    "id": "a",
                                    "name": "send_invoice",
                                    "arguments": {"invoice_id": "A11Y-3", "amount": 3},
                                }
                            ]
                        }
                    ]
                },
            },
            headers={"Prefer": "wait=20"},
        ).json()
    return [
        f"/interrupts/{agent_run['interrupt']['id']}/",
        "/",
        f"/interrupts/{interrupt_id}/",
        f"/runs/{run_id}/",
        "/runs/",
        "/start/",
        "/start/send_invoice/",
        f"/bulk/?verb=approve&ids={interrupt_id}",
        "/settings/notifications/",
    ]


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_passes_axe_in_both_colour_schemes_on_desktop_and_phone(
    site: Site, browser: Browser, scheme: Scheme, viewport: ViewportSize
) -> None:
    server = site.serve()
    urls = pages_to_check(server, site.token)
    problems: dict[str, Any] = {}
    width = f"{viewport['width']}px"

    def check(page: Page, where: str) -> None:
        if found := violations(page):
            problems[where] = found
        if viewport is PHONE and (extra_px := sideways(page)):
            problems[where + " scrolls sideways"] = f"{extra_px} px"

    # Signed out: the login page.
    anonymous = browser.new_context(
        base_url=server.url, color_scheme=scheme, viewport=viewport, bypass_csp=True
    ).new_page()
    anonymous.goto("/login/")
    check(anonymous, f"/login/ {width} {scheme}")
    anonymous.context.close()
    for username, extra in (("reviewer1", urls), ("auditor", ["/history/"])):
        page = signed_in(browser, server, username, scheme, viewport)
        for url in extra:
            page.goto(url)
            page.wait_for_load_state("networkidle")
            check(page, f"{url} {width} {scheme}")
        if username == "reviewer1":
            # A bulk decision's result, of one of its own.
            page.goto(f"/bulk/?verb=approve&ids={start_invoice(server, site.token, 'A11Y-B')}")
            page.locator("form.bulk-confirm button.approve").click()
            expect(page.locator("h1")).to_have_text("Approved 1 of 1")
            check(page, f"bulk result {width} {scheme}")
        page.context.close()
    assert not problems, json.dumps(problems, indent=1)


def test_the_phone_shows_rows_as_cards_and_a_header_that_fits(site: Site, browser: Browser) -> None:
    server = site.serve()
    start_invoice(server, site.token, "PHONE-1")
    page = signed_in(browser, server, "reviewer1", "light", PHONE)
    header = page.locator("header.site")
    box = header.bounding_box()
    assert box is not None and box["height"] < 120, box
    row = page.locator("#inbox-rows > tr").first
    expect(row).to_be_visible()
    # A card, not a table row. Asked again until it holds: a live push may swap the row in as
    # it is read (a detached row has no computed style).
    expect(row).to_have_css("display", "block")
    expect(page.locator("table.inbox thead")).to_have_css("display", "none")
    assert sideways(page) == 0


def test_a_new_approval_is_announced_to_screen_readers(site: Site, browser: Browser) -> None:
    server = site.serve()
    page = signed_in(browser, server, "reviewer1", "light", DESKTOP)
    region = page.locator("#inbox-announce")
    assert region.get_attribute("aria-live") == "polite"
    start_invoice(server, site.token, "SR-1")
    expect(region).to_have_text("New approval: Approve sending the invoice? 1 waiting.")


def test_each_rows_checkbox_is_named_by_its_approval(site: Site, browser: Browser) -> None:
    server = site.serve()
    interrupt_id = start_invoice(server, site.token, "NAME-1")
    page = signed_in(browser, server, "reviewer1", "light", DESKTOP)
    box = page.get_by_role("checkbox", name="Select Approve sending the invoice?")
    expect(box).to_have_attribute("value", str(interrupt_id))
