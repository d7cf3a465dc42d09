"""The scaled setup under faults: PostgreSQL, Redis, several daphne and Celery worker
processes, all real and started by the tests. SQLite where the issue asks for both."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.integration.processes import Server, Site, logged_in_reviewer, stop, wait_for

pytestmark = pytest.mark.integration


def wait_for_status(
    api: httpx.Client, run_id: int, status: str, timeout: float = 40, tick: Any = None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        response = api.get(f"/api/runs/{run_id}")
        if response.status_code == 503 and time.monotonic() < deadline:
            # The database is (re)starting: the API says so, and the run is read again.
            time.sleep(0.2)
            continue
        assert response.status_code == 200, response.text
        detail: dict[str, Any] = response.json()
        if detail["status"] == status:
            return detail
        assert time.monotonic() < deadline, f"run {run_id} is {detail['status']}, not {status}: {detail}"
        if tick:
            tick()
        time.sleep(0.2)


def start_effect(server: Server, token: str, key: str, seconds: float = 0) -> dict[str, Any]:
    with server.client(token) as api:
        run: dict[str, Any] = api.post(
            "/api/runs",
            json={"action": "counted_effect", "input": {"key": key, "seconds": seconds}},
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted", run
    return run


def issue_tokens(site: Site, count: int) -> list[str]:
    code = (
        "from actions.models import ApiToken, Team; t = Team.objects.get(slug='demo'); "
        f"print('\\n'.join(ApiToken.issue(t, f'bot-{{i}}')[1] for i in range({count})))"
    )
    return [word for word in site.manage("shell", "-c", code).split() if word.startswith("gl_")]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_fifty_concurrent_approvals_give_one_decision_one_resume_and_49_conflicts(
    database: str, request: pytest.FixtureRequest
) -> None:
    if database == "sqlite":
        site: Site = request.getfixturevalue("site")
        servers = [site.serve()]
    else:
        site = request.getfixturevalue("scaled_site")
        servers = [site.web(), site.web()]
        site.worker("w1")
        site.worker("w2")
    run = start_effect(servers[0], site.token, "race")
    resume_path = f"/api/interrupts/{run['interrupt']['id']}/resume"
    tokens = issue_tokens(site, 50)

    async def approve_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        servers[i % len(servers)].url + resume_path,
                        json={"data": {"approver": i}},
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    for i, token in enumerate(tokens)
                )
            )

    responses = asyncio.run(approve_all())
    codes = Counter(response.status_code for response in responses)
    assert codes[409] == 49 and codes[200] + codes[202] == 1, codes
    winner = next(i for i, r in enumerate(responses) if r.status_code in (200, 202))
    for response in responses:
        if response.status_code == 409:
            body = response.json()
            assert body["decided_by"] == f"API token bot-{winner}"
            assert re.match(rf"already approved by API token bot-{winner} at ", body["detail"])

    with servers[-1].client(site.token) as api:
        detail = wait_for_status(api, run["id"], "completed")
    assert detail["output"]["answer"] == {"approver": winner}
    assert site.effects("race") == 1
    kinds = site.event_kinds(run["id"])
    assert (kinds.count("approved"), kinds.count("resumed"), kinds.count("claimed")) == (1, 1, 2)


def test_a_worker_killed_mid_step_delays_the_run_but_it_completes_exactly_once(scaled_site: Site) -> None:
    site = scaled_site
    server = site.web()
    doomed = site.worker("doomed", concurrency=1)
    run = start_effect(server, site.token, "crash", seconds=4)
    with server.client(site.token) as api:
        api.post(f"/api/interrupts/{run['interrupt']['id']}/resume", json={"data": {"ok": True}})
        wait_for_status(api, run["id"], "running", timeout=20)
        time.sleep(1)  # inside the action, before its side effect
        stop(doomed, signal.SIGKILL)
        killed = time.monotonic()
        assert site.effects("crash") == 0

        site.worker("survivor", concurrency=1)
        # The sweeper (Celery beat every GRUNDLAG_SWEEP_SECONDS; here `manage.py sweep`)
        # re-queues the step once its lease, no longer renewed, has run out.
        detail = wait_for_status(api, run["id"], "completed", timeout=60, tick=lambda: site.manage("sweep"))
        recovered = time.monotonic() - killed
    assert detail["output"] == {"done": "crash", "answer": {"ok": True}}
    assert site.effects("crash") == 1
    kinds = site.event_kinds(run["id"])
    assert kinds.count("completed") == 1 and kinds.count("requeued") >= 1
    # Taken again once its lease (6 s here) ran out, by a sweep: not left for the broker's
    # redelivery or a restart. The figure (under 15 s, as deployed) is bench.recovery's; here a
    # bound generous enough for a busy machine (it took 16 s once under the full suite).
    assert recovered < 40, recovered


def test_a_step_longer_than_its_lease_is_not_run_again_while_its_worker_lives(scaled_site: Site) -> None:
    """The worker renews the lease of the step it is running (a heartbeat): a step of 8 s under
    a lease of 2 s, swept all the while, with another worker idle and ready to take it."""
    site = scaled_site
    site.env["GRUNDLAG_STEP_LEASE_SECONDS"] = "2"
    server = site.web()
    site.worker("busy", concurrency=1)
    site.worker("idle", concurrency=1)
    run = start_effect(server, site.token, "long", seconds=8)
    with server.client(site.token) as api:
        api.post(f"/api/interrupts/{run['interrupt']['id']}/resume", json={"data": {"ok": True}})
        wait_for_status(api, run["id"], "completed", timeout=60, tick=lambda: site.manage("sweep"))
    kinds = site.event_kinds(run["id"])
    assert "requeued" not in kinds, kinds
    assert kinds.count("claimed") == 2  # the first step, and the one after approval: once each
    assert site.effects("long") == 1


def test_pending_interrupts_survive_stopping_every_web_and_worker_process(scaled_site: Site) -> None:
    site = scaled_site
    web, worker = site.web(), site.worker("w1")
    runs = [start_effect(web, site.token, f"restart-{i}") for i in range(10)]
    stop(web.proc)
    stop(worker)

    web = site.web()
    site.worker("w2")
    with web.client(site.token) as api:
        pending = api.get("/api/interrupts", params={"status": "pending"}).json()["items"]
        assert sorted(p["id"] for p in pending) == sorted(r["interrupt"]["id"] for r in runs)
        for run in runs:
            api.post(f"/api/interrupts/{run['interrupt']['id']}/resume", json={"data": {"ok": True}})
        for run in runs:
            detail = wait_for_status(api, run["id"], "completed")
            assert len(detail["transcript"]) == 1
    for i, run in enumerate(runs):
        assert site.effects(f"restart-{i}") == 1
        assert site.event_kinds(run["id"]).count("claimed") == 2


def test_a_decision_while_postgresql_is_down_is_refused_clearly_and_changes_nothing(
    scaled_site: Site,
) -> None:
    site = scaled_site
    web = site.web()
    site.worker("w1")
    run = start_effect(web, site.token, "outage")
    interrupt_id = run["interrupt"]["id"]

    reviewer = logged_in_reviewer(web)
    page = reviewer.get(f"/interrupts/{interrupt_id}/")
    assert page.status_code == 200
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert csrf is not None

    site.postgres.stop()
    try:
        with web.client(site.token) as api:
            refused = api.post(f"/api/interrupts/{interrupt_id}/resume", json={"data": {"ok": True}})
            assert refused.status_code == 503
            assert refused.json()["detail"].startswith(
                "The database is unavailable right now. Nothing was changed"
            )
        clicked = reviewer.post(
            f"/interrupts/{interrupt_id}/approve/",
            data={"csrfmiddlewaretoken": csrf.group(1)},
            headers={"Referer": f"{web.url}/interrupts/{interrupt_id}/"},
        )
        assert clicked.status_code == 503 and "Nothing was changed" in clicked.text
    finally:
        site.postgres.start()

    with web.client(site.token) as api:
        detail = api.get(f"/api/runs/{run['id']}").json()
        assert detail["status"] == "interrupted" and detail["transcript"][0]["status"] == "pending"
        assert "approved" not in site.event_kinds(run["id"])
        resumed = api.post(f"/api/interrupts/{interrupt_id}/resume", json={"data": {"ok": True}})
        assert resumed.status_code < 300, resumed.text
        assert wait_for_status(api, run["id"], "completed")["output"]["answer"] == {"ok": True}
    assert site.effects("outage") == 1


def test_a_step_whose_worker_finds_the_database_down_runs_once_it_is_back(scaled_site: Site) -> None:
    """The step's message reaches a worker while PostgreSQL restarts: the task is sent again a
    moment later, and the step runs once the database answers, without waiting for a sweeper
    (no beat runs here)."""
    site = scaled_site
    web = site.web()
    worker = site.worker("w1")
    run = start_effect(web, site.token, "restart")
    stop(worker)
    with web.client(site.token) as api:
        resumed = api.post(f"/api/interrupts/{run['interrupt']['id']}/resume", json={"data": {"ok": True}})
        assert resumed.status_code < 300, resumed.text  # queued, its message waiting in Redis
    site.postgres.stop()
    try:
        site.worker("w2")
        time.sleep(4)  # the worker takes the message, and finds no database
    finally:
        site.postgres.start()
    with web.client(site.token) as api:
        assert wait_for_status(api, run["id"], "completed", timeout=30)["output"]["answer"] == {"ok": True}
    assert site.effects("restart") == 1


def test_after_the_database_restarts_the_api_answers_503_then_serves_again(scaled_site: Site) -> None:
    """The pool's connections die with the database. While the pool replaces them (psycopg_pool
    checks each as it lends it, backing off between failures), a request is told 503 "nothing
    was changed, try again", never a 500; within seconds every request is served again."""
    site = scaled_site
    web = site.web()
    site.worker("w1")
    run = start_effect(web, site.token, "pool")

    # As many at once as one token may have under way (GRUNDLAG_MAX_REQUESTS_PER_TOKEN).
    at_once = 4

    def read_concurrently(api: httpx.Client) -> list[int]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(at_once) as threads:
            return list(threads.map(lambda _: api.get(f"/api/runs/{run['id']}").status_code, range(at_once)))

    with web.client(site.token) as api:
        assert read_concurrently(api) == [200] * at_once  # several connections in the pool
    site.postgres.stop()
    site.postgres.start()  # returns once it accepts connections
    restarted = time.monotonic()
    with web.client(site.token) as api:
        while (response := api.get(f"/api/runs/{run['id']}")).status_code != 200:
            assert response.status_code == 503, response.text
            assert response.json()["detail"].startswith("The database is unavailable right now"), (
                response.text
            )
            assert time.monotonic() - restarted < 15, "the pool did not recover"
        assert read_concurrently(api) == [200] * at_once
        assert [api.get(f"/api/runs/{run['id']}").status_code for _ in range(12)] == [200] * 12


def test_an_idle_socket_over_channels_redis_stays_open_and_still_gets_pushes(scaled_site: Site) -> None:
    """redis-py 8 times blocking reads out after 5 s unless told otherwise; an idle consumer
    must outlive that, or every reviewer's socket would drop and reconnect every 5 s."""
    import websockets

    site = scaled_site
    web = site.web()
    site.worker("w1")
    reviewer = logged_in_reviewer(web)
    cookie = f"sessionid={reviewer.cookies['sessionid']}"

    async def idle_then_receive() -> dict[str, Any]:
        async with websockets.connect(
            f"ws://127.0.0.1:{web.port}/ws/inbox/", additional_headers={"Cookie": cookie, "Origin": web.url}
        ) as ws:
            assert json.loads(await ws.recv())["event"] == "hello"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(ws.recv(), 7)  # idle past redis-py's default timeout
            run = await asyncio.to_thread(start_effect, web, site.token, "idle")
            while True:
                frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 15))
                if frame["event"] == "interrupt" and frame["interrupt_id"] == run["interrupt"]["id"]:
                    return frame

    assert asyncio.run(idle_then_receive())["status"] == "pending"


def test_a_waiting_request_is_woken_across_processes_by_postgresql_not_by_its_fallback_poll(
    scaled_site: Site,
) -> None:
    """The step runs in a Celery worker, the request waits in daphne: with the fallback poll
    slower than the test's patience, only PostgreSQL's notification can wake it in time."""
    site = scaled_site
    site.env["GRUNDLAG_WAIT_POLL_SECONDS"] = "30"
    web = site.web()
    site.worker("w1", wait_ready=True)  # its start is not what is timed
    # The web process listens from its start (before it, a waiter polls fast: not what is tested).
    listening = "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'grundlag-listen'"
    wait_for(lambda: site.sql(listening)[0][0] == 1, what="daphne listening")
    with web.client(site.token) as api:
        for key in ("wake-1", "wake-2", "wake-3"):
            began = time.monotonic()
            run = api.post(
                "/api/runs",
                json={"action": "counted_effect", "input": {"key": key, "seconds": 0}},
                headers={"Prefer": "wait=25"},
            ).json()
            assert run["status"] == "interrupted", run
            resumed = api.post(
                f"/api/interrupts/{run['interrupt']['id']}/resume",
                json={"data": {"ok": True}},
                headers={"Prefer": "wait=25"},
            ).json()
            assert resumed["status"] == "completed", resumed
            assert time.monotonic() - began < 5, "woken by the poll, not by the notification"


def test_requests_reuse_pooled_database_connections(scaled_site: Site) -> None:
    """Under ASGI each request's database work runs in a thread of its own: without the pool,
    every request opened (and closed) a connection of its own, about 10 ms before its first
    query. With it, a web process keeps a few connections open and lends them out."""
    site = scaled_site
    web = site.web()
    backends = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend' AND application_name <> 'grundlag-listen'"
    )
    with web.client(site.token) as api:
        for _ in range(3):
            assert api.get("/api/interrupts").status_code == 200
        before = {pid for (pid,) in site.sql(backends)}
        for _ in range(20):
            assert api.get("/api/interrupts").status_code == 200
        after = {pid for (pid,) in site.sql(backends)}
    assert before, "no connection was kept open between requests"
    assert after == before, "requests opened connections of their own"
