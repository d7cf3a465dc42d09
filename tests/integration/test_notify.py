"""Notifications end to end, as deployed: a webhook registered over the API hears of a run's
events from the serving processes on their own (the dispatch after commit, the delivery task),
in the embedded setup and the scaled one (the delivery in a Celery worker)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
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
    web = scaled_site.web()
    scaled_site.worker("w1")
    a_run_is_told(web, scaled_site.token, receiver)


def test_notifications_go_through_workers_of_their_own_queue(scaled_site: Site, receiver: Receiver) -> None:
    """As deploy/Procfile runs it: a worker for the steps (-Q celery), another, niced, for the
    notifications (-Q notify). The steps' worker never fans out or delivers."""
    scaled_site.env["GRUNDLAG_WEBHOOK_ALLOW_PRIVATE"] = "true"
    web = scaled_site.web()
    scaled_site.worker("steps", queues="celery")
    scaled_site.worker("notify", queues="notify", nice=10)
    a_run_is_told(web, scaled_site.token, receiver)
    steps_log = (scaled_site.log_dir / "worker-steps.log").read_text()
    notify_log = (scaled_site.log_dir / "worker-notify.log").read_text()
    assert "actions.tasks.run_step" in steps_log
    for task in ("actions.tasks.dispatch", "actions.tasks.deliver_notifications"):
        assert f"Task {task}[" in notify_log, task
        assert f"Task {task}[" not in steps_log, task


def notifier_of(server: Server) -> int:
    """The pid of the embedded server's notifier process (its one child)."""

    def child() -> int | None:
        # Each thread's children: the server's feeding thread starts a notifier again.
        tasks = Path(f"/proc/{server.proc.pid}/task").glob("*/children")
        pids = [int(pid) for task in tasks for pid in task.read_text().split() if alive(int(pid))]
        return pids[0] if len(pids) == 1 else None

    return int(wait_for(child, timeout=20, what="the notifier process"))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def sending_a_new_interrupt(
    server: Server, token: str, receiver: Receiver, invoice: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A webhook for new interrupts, and a run paused; returns (the webhook, the run) once its
    notification has reached the receiver (which may hold it: ``receiver.delays``)."""
    with server.client(token) as api:
        hook = api.post("/api/webhooks", json={"url": receiver.url, "events": ["interrupt.created"]}).json()
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": invoice, "amount": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted", run
    assert receiver.arrived.wait(20), "its notification was never sent"
    return hook, run


def test_the_embedded_notifier_is_started_again_when_it_dies(site: Site, receiver: Receiver) -> None:
    site.env.update(GRUNDLAG_WEBHOOK_ALLOW_PRIVATE="true", GRUNDLAG_SWEEP_SECONDS="1")
    server = site.serve()
    first = notifier_of(server)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), timeout=10, what="the notifier to die")
    # Its successor is started by the server's next periodic round, or by the first thing to
    # tell: either way the run is told, whatever was lost with the first.
    a_run_is_told(server, site.token, receiver)
    assert notifier_of(server) != first
    log = next(site.log_dir.glob("serve-*.log")).read_text()
    assert "the notifier exited" in log


def test_the_notifier_goes_with_its_server(site: Site) -> None:
    server = site.serve()
    notifier = notifier_of(server)
    stop(server.proc, signal.SIGKILL)
    wait_for(lambda: not alive(notifier), timeout=20, what="the notifier to end with its server")


def test_a_server_stopped_mid_send_lets_its_notifier_finish_the_send(site: Site, receiver: Receiver) -> None:
    """SIGTERM to the server (and, from a supervisor, to the notifier beside it) while the
    notifier waits on a slow endpoint: the send under way finishes and is recorded, and both
    exit."""
    site.env.update(GRUNDLAG_WEBHOOK_ALLOW_PRIVATE="true")
    server = site.serve()
    notifier = notifier_of(server)
    receiver.delays = [2]
    sending_a_new_interrupt(server, site.token, receiver, "T-1")
    os.kill(notifier, signal.SIGTERM)  # as systemd's stop does, to the whole group
    assert stop(server.proc, signal.SIGTERM, timeout=20) == 0
    assert not alive(notifier)
    outcome = site.sql("SELECT outcome, attempts FROM actions_notification WHERE channel = 'webhook'")
    assert outcome == [("delivered", 1)]


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
    web = scaled_site.web()
    doomed = scaled_site.worker("w1")
    receiver.delays = [60]  # the first request hangs until its sender is gone
    hook, run = sending_a_new_interrupt(web, scaled_site.token, receiver, "K-1")
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
