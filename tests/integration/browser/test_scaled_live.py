"""Live updates across processes: reviewers on two daphne processes, steps run by a separate
Celery worker, pushes through Redis. Redis restarts under them."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from tests.integration.browser.conftest import log_in, start_invoice
from tests.integration.processes import Site

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_pushes_cross_processes_and_survive_a_redis_restart(scaled_site: Site, browser: Browser) -> None:
    """A push lost while Redis restarts (nothing after it shows the gap) reaches the page with
    the next recheck of its socket, which says where the team's stream is."""
    site = scaled_site
    # As deployed, with beat, whose sweeper sends a step again whose message the restart lost
    # (after a grace shortened here, as the socket's recheck is).
    site.env.update(GRUNDLAG_SOCKET_RECHECK_SECONDS="3", GRUNDLAG_QUEUED_GRACE_SECONDS="3")
    web_a, web_b = site.web(), site.web()
    site.worker("w1")
    site.beat()
    reviewer1 = log_in(browser, web_a.url, "reviewer1")
    reviewer2 = log_in(browser, web_b.url, "reviewer2")

    first = start_invoice(web_a, site.token, "BEFORE-1")
    for page in (reviewer1, reviewer2):
        expect(page.locator(f"#interrupt-{first}")).to_be_visible()

    site.redis.stop()
    site.redis.start()

    # The worker may still be reconnecting: the step runs once it has, or once it is sent again.
    second = start_invoice(web_b, site.token, "AFTER-1", wait=30)
    for page in (reviewer1, reviewer2):
        expect(page.locator(f"#interrupt-{second}")).to_be_visible(timeout=30_000)
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
