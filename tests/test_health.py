"""Production's endpoints: /healthz, /readyz and the access-controlled /metrics."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from actions import engine, metrics
from actions.models import Run, Team
from actions.web import health

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps")]

TOKEN = "metrics-test-token-0123456789"


@pytest.fixture(autouse=True)
def fresh_readiness(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(health, "_last_check", None)  # each test checks anew


def scrape(client: Client) -> str:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return response.content.decode()


def sample(text: str, name: str, **labels: str) -> float:
    """A sample's value from Prometheus's text format (0 when it is not there)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, rest = series.partition("{")
        found = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if metric == name and found == wanted:
            return float(value)
    return 0.0


def test_healthz_answers_where_the_edge_is_not_in_front(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok\n"


async def test_healthz_is_answered_before_anything_else_runs() -> None:
    """The event loop answers it: the app behind (Django, the token and body caps) is not run,
    so a busy process still answers its orchestrator. Every other path goes on to the app."""
    reached: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    transport = httpx.ASGITransport(app=health.answering_liveness(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        up = await http.get("/healthz")
        assert (up.status_code, up.content, up.headers["content-type"]) == (200, b"ok\n", "text/plain")
        head = await http.head("/healthz")
        assert (head.status_code, head.content) == (200, b"")
        posted = await http.post("/healthz")
        assert (posted.status_code, posted.headers["allow"]) == (405, "GET, HEAD")
        assert (await http.get("/healthz/")).status_code == 204
        assert (await http.get("/api/runs")).status_code == 204
    assert reached == ["/healthz/", "/api/runs"]


def test_readyz_says_what_answers(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ready": True, "database": "ok", "broker": "ok", "channel_layer": "ok"}


def test_readyz_is_503_naming_a_broker_that_does_not_answer(client: Client, settings: Any) -> None:
    from tests.integration.processes import free_port

    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "database": "ok",
        "broker": "unavailable",
        "channel_layer": "ok",
    }


def test_metrics_are_off_without_a_token_and_refused_without_the_right_one(
    client: Client, settings: Any, reviewer: User
) -> None:
    settings.GRUNDLAG_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    settings.GRUNDLAG_METRICS_TOKEN = TOKEN
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
        assert b"grundlag" not in response.content
    # A logged-in reviewer (even staff) is no bearer of the token.
    reviewer.is_staff = True
    reviewer.save()
    client.force_login(reviewer)
    assert client.get("/metrics").status_code == 401


def test_metrics_count_pending_decisions_steps_and_queue_wait(
    client: Client, settings: Any, team: Team, reviewer: User, steps: str
) -> None:
    settings.GRUNDLAG_METRICS_TOKEN = TOKEN
    before = scrape(client)
    runs = [
        engine.start_run("send_invoice", {"invoice_id": f"M-{i}", "amount": 1}, team, reviewer)
        for i in range(3)
    ]
    text = scrape(client)
    assert sample(text, "grundlag_pending_interrupts", team=team.slug) == 3

    first, second = (engine.pending_interrupts(run.pk)[0] for run in runs[:2])
    engine.resume(first, {"approved": True}, reviewer)
    engine.reject(second, "not this one", reviewer)
    text = scrape(client)
    assert sample(text, "grundlag_pending_interrupts", team=team.slug) == 1
    for outcome in ("approved", "rejected"):
        counted = sample(text, "grundlag_decisions_total", team=team.slug, outcome=outcome)
        assert counted - sample(before, "grundlag_decisions_total", team=team.slug, outcome=outcome) == 1
    decided = sample(text, "grundlag_time_to_decision_seconds_count", team=team.slug)
    assert decided - sample(before, "grundlag_time_to_decision_seconds_count", team=team.slug) == 2
    # Three steps that paused, one that completed after approval, one that ended on the rejection.
    counted_steps = sum(
        sample(text, "grundlag_step_seconds_count", action="send_invoice", status=status)
        - sample(before, "grundlag_step_seconds_count", action="send_invoice", status=status)
        for status in ("interrupted", "completed", "rejected", "failed")
    )
    assert counted_steps >= 4
    assert Run.objects.get(pk=runs[0].pk).status == "completed"
    # Queued and claimed by a worker: how long each waited (inline steps are never queued).
    waited = sample(text, "grundlag_queue_wait_seconds_count") - sample(
        before, "grundlag_queue_wait_seconds_count"
    )
    assert waited == (4 if steps == "worker" else 0)


def test_open_sockets_and_push_fanout_are_figures(settings: Any) -> None:
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    assert "grundlag_open_sockets " in text and "grundlag_push_fanout_seconds_count " in text
    assert "grundlag_queue_wait_seconds_count " in text
    assert metrics.OPEN_SOCKETS is not None
