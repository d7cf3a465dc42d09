"""A standing grant in Chromium (issue 21): a reviewer approves "and allows the same for 1
hour" from the decision form; the same request through the API is then approved by the grant
without anyone; the Grants page revokes it, and the next one waits for a person again."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.integration.browser.conftest import log_in, start_invoice
from tests.integration.processes import Site

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def started(server: Any, token: str, invoice_id: str) -> dict[str, Any]:
    with server.client(token) as api:
        run: dict[str, Any] = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": invoice_id, "amount": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
    return run


def test_approve_and_allow_the_same_then_revoke_from_the_grants_page(site: Site, browser: Browser) -> None:
    server = site.serve()
    page = log_in(browser, server.url, "reviewer1")
    first = start_invoice(server, site.token, "GRANT-1")
    page.goto(f"/interrupts/{first}/")
    page.locator("details.grant summary").click()
    page.get_by_label("For 1 hour").check()
    page.locator("button.approve").click()
    expect(page.locator(".decision .notice")).to_contain_text("the same is allowed for 1 hour")

    again = started(server, site.token, "GRANT-1")
    assert again["status"] == "completed", again
    assert started(server, site.token, "GRANT-2")["status"] == "interrupted"  # other arguments

    page.goto("/grants/")
    live = page.locator("#live-grants tbody tr")
    expect(live).to_have_count(1)
    expect(live).to_contain_text("the same arguments")
    expect(live.locator("td").nth(6)).to_have_text("1")  # used once
    live.get_by_role("button", name="Revoke").click()
    expect(page.locator("#live-grants")).to_contain_text("No grant is in force")
    expect(page.locator("#ended-grants")).to_contain_text("revoked by reviewer1")
    assert started(server, site.token, "GRANT-1")["status"] == "interrupted"
