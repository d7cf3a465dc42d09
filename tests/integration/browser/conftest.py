from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright

from tests.integration.processes import Server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# What a page is expected to show, it is waited for up to this long (Playwright's default is
# 5 s): the suite runs in two processes on two cores, with servers and browsers of its own, and
# a live update that arrives in 50 ms on a quiet machine may take seconds on a busy one. An
# expectation met returns at once; only a failure takes the whole time.
expect.set_options(timeout=20_000)


# Module scope, not session: Playwright's sync API keeps an event loop running in this thread
# while it is open, and async tests (or asyncio.run) after it would find that loop running.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("browser tests need Debian's Chromium: apt-get install chromium (.ci/run does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def log_in(browser: Browser, base_url: str, username: str, password: str | None = None) -> Page:
    context = browser.new_context(base_url=base_url, viewport={"width": 1200, "height": 720})
    page = context.new_page()
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password or f"{username}-demo")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")
    wait_live(page)
    return page


def wait_live(page: Page, timeout: float = 15_000) -> None:
    page.wait_for_selector("#live[data-state=live]", timeout=timeout)


def collect_dialogs(page: Page) -> list[str]:
    """Any alert()/confirm() a page opens: an XSS payload that ran would show up here."""
    dialogs: list[str] = []

    def record(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", record)
    return dialogs


def start_invoice(server: Server, token: str, invoice_id: str, wait: int = 20, patience: float = 120) -> int:
    """Start a run of send_invoice through the API, waiting until it has paused; its interrupt.
    A run still queued after ``wait`` (a worker reconnecting to its broker, a machine busy with
    other work) is read again, each read waiting for its change, for up to ``patience`` seconds:
    what is asserted is that it pauses, not how soon."""
    deadline = time.monotonic() + patience
    with server.client(token) as api:
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": invoice_id, "amount": 1}},
            headers={"Prefer": f"wait={wait}"},
        ).json()
        while run.get("status") in ("queued", "running") and time.monotonic() < deadline:
            run = api.get(f"/api/runs/{run['id']}", headers={"Prefer": "wait=10"}).json()
    assert run["status"] == "interrupted", run
    return int(run["interrupt"]["id"])
