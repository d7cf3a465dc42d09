"""Notifications end to end, as deployed: a webhook registered over the API hears of a run's
events from the serving processes on their own (the dispatch after commit, the delivery task),
in the embedded setup and the scaled one (the delivery in a Celery worker)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.integration.processes import Server, Site, wait_for
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.stop()


def a_run_is_told(web: Server, token: str, receiver: Receiver) -> None:
    with web.client(token) as api:
        hook = api.post(
            "/api/webhooks",
            json={"url": receiver.url, "events": ["interrupt.created", "interrupt.decided", "run.finished"]},
        )
        assert hook.status_code == 201, hook.text
        secret = hook.json()["secret"]
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": "N-1", "amount": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
        assert run["status"] == "interrupted", run

        def told() -> list[dict[str, Any]]:
            return receiver.verified(secret)

        first = wait_for(lambda: told() or None, timeout=20, what="the webhook for the new interrupt")
        assert [body["type"] for body in first] == ["interrupt.created"]
        assert first[0]["data"]["id"] == run["interrupt"]["id"]
        answer = {"data": {"approved": True}}
        api.post(run["interrupt"]["resume_url"], json=answer, headers={"Prefer": "wait=20"})
        bodies = wait_for(lambda: told() if len(told()) >= 3 else None, timeout=20, what="the decisions")
        # Deliveries run side by side and are not ordered; the body's timestamp orders them.
        in_order = sorted(bodies, key=lambda body: datetime.fromisoformat(body["timestamp"]))
        assert [body["type"] for body in in_order] == [
            "interrupt.created",
            "interrupt.decided",
            "run.finished",
        ]
        assert in_order[2]["data"]["status"] == "completed"


def test_a_webhook_hears_of_a_run_from_the_embedded_server(site: Site, receiver: Receiver) -> None:
    site.env["GRUNDLAG_WEBHOOK_ALLOW_PRIVATE"] = "true"
    a_run_is_told(site.serve(), site.token, receiver)


def test_a_webhook_hears_of_a_run_through_a_celery_worker(scaled_site: Site, receiver: Receiver) -> None:
    scaled_site.env["GRUNDLAG_WEBHOOK_ALLOW_PRIVATE"] = "true"
    web = scaled_site.daphne()
    scaled_site.worker("w1")
    a_run_is_told(web, scaled_site.token, receiver)
