"""Notifications end to end, as deployed: a webhook registered over the API hears of a run's
events from the serving processes on their own (the dispatch after commit, the delivery task),
in the embedded setup and the scaled one (the delivery in a Celery worker)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.integration.processes import Server, Site, stop, wait_for
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


def test_a_webhook_whose_worker_was_killed_mid_send_is_delivered_by_another(
    scaled_site: Site, receiver: Receiver
) -> None:
    """The worker sending a notification is SIGKILLed while the endpoint holds the request;
    once its claim runs out, the periodic round hands it to another worker: delivered, at most
    one duplicate, under the same webhook-id."""
    scaled_site.env.update(
        GRUNDLAG_WEBHOOK_ALLOW_PRIVATE="true",
        GRUNDLAG_SEND_LEASE_SECONDS="3",
        GRUNDLAG_WEBHOOK_TIMEOUT_SECONDS="30",
        GRUNDLAG_SWEEP_SECONDS="1",
    )
    web = scaled_site.daphne()
    doomed = scaled_site.worker("w1")
    receiver.delays = [60]  # the first request hangs until its sender is gone
    with web.client(scaled_site.token) as api:
        hook = api.post("/api/webhooks", json={"url": receiver.url, "events": ["interrupt.created"]}).json()
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": "K-1", "amount": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted", run
    assert receiver.arrived.wait(20), "the first worker never sent it"
    stop(doomed, signal.SIGKILL)
    scaled_site.worker("w2")
    scaled_site.beat()
    wait_for(lambda: len(receiver.received) >= 2 or None, timeout=30, what="the delivery by the other worker")
    time.sleep(2)  # nothing more comes: it is delivered
    ids = [headers["webhook-id"] for headers, _ in receiver.received]
    assert len(ids) == 2 and ids[0] == ids[1], "one duplicate, under the same id"
    (body,) = {json.dumps(b, sort_keys=True) for b in receiver.verified(hook["secret"])}
    assert json.loads(body)["data"]["run_id"] == run["id"]
    outcome = scaled_site.sql("SELECT outcome, attempts FROM actions_notification WHERE channel = 'webhook'")
    assert outcome == [("delivered", 2)]
