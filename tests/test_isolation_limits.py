"""No token can stall the others: a rate of requests per token on the API and the MCP endpoint
(429 with Retry-After past it), and a cap on each token's requests held waiting (`Prefer: wait`,
MCP's tasks/result), past which a request is answered at once with what there is. Requests go
through Django's ASGI handler (a request's thread, its client's disconnect) and the MCP endpoint
as daphne would run them, in-process, on SQLite."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import httpx
import httpx2
import mcp_types as types
import pytest
from django.core.asgi import get_asgi_application
from django.core.cache import cache
from django.test import Client
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from actions import mcp
from actions.live import waiting
from actions.models import ApiToken, Team

pytestmark = pytest.mark.django_db

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
django_app = get_asgi_application()
QUESTION = {"message": "Deploy v2.3 to production?", "data": {"service": "billing"}}


@pytest.fixture(autouse=True)
def _fresh_rate_windows() -> None:
    """The throttle's windows are in the cache, which outlives a test; a token's id may be
    another test's token's (the other database variant's)."""
    cache.clear()


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


def ask(key: str) -> int:
    """A pending approval asked with the token; its id."""
    response = Client().post(
        "/api/approvals", json.dumps(QUESTION), content_type="application/json", headers=bearer(key)
    )
    assert response.status_code == 202, response.content
    return int(response.json()["id"])


@asynccontextmanager
async def http(app: Any = django_app) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as c:
        yield c


async def timed(request: Awaitable[T]) -> tuple[T, float]:
    began = time.monotonic()
    result = await request
    return result, time.monotonic() - began


async def until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


def held(token_id: int) -> int:
    """The token's requests held waiting in this process now."""
    return waiting.waits.held.get(token_id, 0)


def id_of(token_key: str) -> int:
    return ApiToken.objects.get(prefix=token_key[:10]).pk


# The rate of requests


def test_a_token_over_its_rate_gets_429_with_retry_after_while_other_tokens_go_on(
    settings: Any, team: Team, token_key: str, other_token_key: str
) -> None:
    settings.GRUNDLAG_API_RATE = "3/min"
    client = Client()
    for _ in range(3):
        assert client.get("/api/actions", headers=bearer(token_key)).status_code == 200
    refused = client.get("/api/actions", headers=bearer(token_key))
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused["Content-Type"].startswith("application/json")
    assert refused.json() == {"detail": "Too many requests."}
    # A POST too, before anything is started.
    started = client.post(
        "/api/approvals", json.dumps(QUESTION), "application/json", headers=bearer(token_key)
    )
    assert started.status_code == 429 and "Retry-After" in started

    # Another team's token, and another token of the same team: budgets of their own.
    assert client.get("/api/actions", headers=bearer(other_token_key)).status_code == 200
    second_key = ApiToken.issue(team, "second")[1]
    assert client.get("/api/actions", headers=bearer(second_key)).status_code == 200


def test_without_a_rate_a_token_is_not_throttled(settings: Any, token_key: str) -> None:
    settings.GRUNDLAG_API_RATE = ""
    client = Client()
    assert all(client.get("/api/actions", headers=bearer(token_key)).status_code == 200 for _ in range(30))


def test_the_openapi_document_says_every_operation_may_answer_429(client: Client) -> None:
    document = client.get("/api/openapi.json").json()
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert len(operations) > 10
    for operation in operations:
        too_many = operation["responses"]["429"]
        assert "Retry-After" in too_many["headers"]
        assert too_many["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    read = document["paths"]["/api/approvals/{approval_id}"]["get"]
    assert {"Preference-Applied", "Grundlag-Wait-Declined"} <= set(read["responses"]["200"]["headers"])


MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-11-25",
}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


@pytest.mark.django_db(transaction=True)  # waits served on other threads, with their own connections
def test_mcp_answers_429_with_retry_after_past_the_tokens_rate_which_it_shares_with_the_api(
    settings: Any, token_key: str, other_token_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.GRUNDLAG_API_RATE = "2/min"
    # Every request of the test in one window, a second into it: a minute's edge between the
    # MCP calls and the API's (it failed in CI at 01:00) would start a new budget.
    now = int(time.time() // 60) * 60 + 1
    monkeypatch.setattr(waiting, "time", SimpleNamespace(time=lambda: now, monotonic=time.monotonic))

    async def scenario() -> list[httpx.Response]:
        async with http(mcp.Endpoint(mcp.build_server())) as client:
            calls = [
                await client.post("/mcp/", json=PING, headers=bearer(key, **MCP_HEADERS))
                for key in (token_key, token_key, token_key, other_token_key)
            ]
        return calls

    first, second, refused, other = asyncio.run(scenario())
    assert (first.status_code, second.status_code) == (200, 200), first.text
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["error"] == "rate_limited"
    assert other.status_code == 200
    # One budget per token, for /api/ and /mcp/.
    assert Client().get("/api/actions", headers=bearer(token_key)).status_code == 429


# Waiting


@pytest.mark.django_db(transaction=True)  # waits served on other threads, with their own connections
def test_past_the_cap_a_tokens_wait_is_answered_at_once_while_another_tokens_waits(
    settings: Any, token_key: str, other_token_key: str
) -> None:
    token_id = id_of(token_key)
    settings.GRUNDLAG_MAX_WAITS_PER_TOKEN = 2
    mine, theirs = ask(token_key), ask(other_token_key)

    def read(client: httpx.AsyncClient, key: str, approval: int, wait: int) -> Awaitable[httpx.Response]:
        return client.get(f"/api/approvals/{approval}", headers=bearer(key, Prefer=f"wait={wait}"))

    async def scenario() -> dict[str, Any]:
        async with http() as client:
            two = [asyncio.ensure_future(timed(read(client, token_key, mine, 2))) for _ in range(2)]
            await until(lambda: held(token_id) == 2, "two of the token's requests are held")
            other = asyncio.ensure_future(timed(read(client, other_token_key, theirs, 1)))
            third = await timed(read(client, token_key, mine, 2))
            results = {"third": third, "other": await other, "two": await asyncio.gather(*two)}
            # Its places are free again once those have been answered.
            assert held(token_id) == 0
            results["after"] = await timed(read(client, token_key, mine, 1))
            return results

    results = asyncio.run(scenario())
    third, seconds = results["third"]
    assert seconds < 1
    assert third.status_code == 200 and third.json()["status"] == "pending"
    assert third.headers["Grundlag-Wait-Declined"] == "too-many-waits"
    assert "Preference-Applied" not in third.headers

    other, seconds = results["other"]
    assert other.headers["Preference-Applied"] == "wait=1" and seconds >= 0.45
    for response, seconds in results["two"]:
        assert response.headers["Preference-Applied"] == "wait=2" and seconds >= 1.45
        assert "Grundlag-Wait-Declined" not in response.headers
    after, seconds = results["after"]
    assert after.headers["Preference-Applied"] == "wait=1" and seconds >= 0.45


@pytest.mark.django_db(transaction=True)  # waits served on other threads, with their own connections
def test_a_wait_answers_half_a_second_before_the_client_would_give_up(token_key: str) -> None:
    approval = ask(token_key)

    async def scenario() -> tuple[httpx.Response, float]:
        async with http() as client:
            return await timed(
                client.get(f"/api/approvals/{approval}", headers=bearer(token_key, Prefer="wait=1"))
            )

    response, seconds = asyncio.run(scenario())
    assert response.status_code == 200 and response.json()["status"] == "pending"
    assert 0.45 <= seconds < 0.9


@pytest.mark.django_db(transaction=True)  # waits served on other threads, with their own connections
def test_a_wait_gives_its_place_back_when_its_client_disconnects_or_it_fails(
    settings: Any, token_key: str
) -> None:
    token_id = id_of(token_key)
    settings.GRUNDLAG_MAX_WAITS_PER_TOKEN = 1
    approval = ask(token_key)

    async def disconnected() -> None:
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            pass

        headers = [(b"authorization", f"Bearer {token_key}".encode()), (b"prefer", b"wait=30")]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": f"/api/approvals/{approval}", "raw_path": b"", "query_string": b"",
            "headers": [(b"host", b"testserver"), *headers], "server": ("testserver", 80),
            "client": ("127.0.0.1", 5000),
        }  # fmt: skip
        request = asyncio.ensure_future(django_app(scope, receive, send))
        await until(lambda: held(token_id) == 1, "the request is held")
        gone.set()
        await asyncio.wait_for(request, 10)
        assert held(token_id) == 0

    async def failed() -> httpx.Response:
        async with http() as client:
            missing = await client.get("/api/approvals/999999", headers=bearer(token_key, Prefer="wait=5"))
            assert missing.status_code == 404
            return await client.get(f"/api/approvals/{approval}", headers=bearer(token_key, Prefer="wait=1"))

    asyncio.run(disconnected())
    assert asyncio.run(failed()).headers["Preference-Applied"] == "wait=1"


# MCP's tasks/result


@asynccontextmanager
async def legacy_session(
    endpoint: mcp.Endpoint, key: str
) -> AsyncIterator[tuple[ClientSession, JSONRPCDispatcher[Any]]]:
    """The official SDK's client, speaking 2025-11-25 (tasks in its core) to the endpoint."""
    client = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=cast(Any, endpoint)),
        headers=bearer(key),
        timeout=httpx2.Timeout(30),
    )
    async with (
        client,
        streamable_http_client("http://testserver/mcp/", http_client=client) as (read, write),
    ):
        dispatcher = JSONRPCDispatcher(read, write)
        async with ClientSession(dispatcher=dispatcher) as session:
            await session.initialize()
            yield session, dispatcher


async def start_task(dispatcher: JSONRPCDispatcher[Any]) -> str:
    raw = await dispatcher.send_raw_request(
        "tools/call",
        {"name": "send_invoice", "arguments": {"invoice_id": "HOLD-1", "amount": 3}, "task": {"ttl": 60000}},
    )
    return types.CreateTaskResult.model_validate(raw, by_name=False).task.task_id


async def task_result(session: ClientSession, task_id: str) -> types.CallToolResult:
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    return await session.send_request(request, types.CallToolResult)


@pytest.mark.django_db(transaction=True)  # waits served on other threads, with their own connections
def test_tasks_result_is_held_at_most_the_hold_time_then_says_the_task_is_still_working(
    settings: Any, token_key: str
) -> None:
    token_id = id_of(token_key)
    settings.GRUNDLAG_MCP_RESULT_HOLD_SECONDS = 1

    async def scenario() -> tuple[MCPError, float]:
        async with legacy_session(mcp.Endpoint(mcp.build_server()), token_key) as (session, dispatcher):
            task_id = await start_task(dispatcher)
            began = time.monotonic()
            with pytest.raises(MCPError) as still_working:
                await asyncio.wait_for(task_result(session, task_id), 10)
            return still_working.value, time.monotonic() - began

    error, seconds = asyncio.run(scenario())
    assert 1 <= seconds < 5
    assert error.code == types.REQUEST_TIMEOUT
    assert "tasks/get" in error.message
    task = types.Task.model_validate(error.data["task"], by_name=False)
    assert task.status == "working" and "Approve sending the invoice?" in (task.status_message or "")
    assert held(token_id) == 0


@pytest.mark.django_db(transaction=True)  # waits served on other threads, with their own connections
def test_past_the_cap_tasks_result_answers_at_once(settings: Any, token_key: str) -> None:
    token_id = id_of(token_key)
    settings.GRUNDLAG_MAX_WAITS_PER_TOKEN = 1
    settings.GRUNDLAG_MCP_RESULT_HOLD_SECONDS = 30

    async def scenario() -> tuple[MCPError, float]:
        async with legacy_session(mcp.Endpoint(mcp.build_server()), token_key) as (session, dispatcher):
            task_id = await start_task(dispatcher)
            holding = asyncio.ensure_future(task_result(session, task_id))
            await until(lambda: held(token_id) == 1, "tasks/result is held")
            began = time.monotonic()
            with pytest.raises(MCPError) as declined:
                await asyncio.wait_for(task_result(session, task_id), 10)
            seconds = time.monotonic() - began
            holding.cancel()
            return declined.value, seconds

    error, seconds = asyncio.run(scenario())
    assert seconds < 1
    assert error.code == types.REQUEST_TIMEOUT and "not held" in error.message
    assert error.data["task"]["status"] == "working"


# The settings


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GRUNDLAG_API_RATE": "lots"}, 'GRUNDLAG_API_RATE must be a rate such as "600/min"'),
        ({"GRUNDLAG_API_RATE": "10/fortnight"}, "GRUNDLAG_API_RATE must be a rate"),
        ({"GRUNDLAG_MAX_WAITS_PER_TOKEN": "0"}, "GRUNDLAG_MAX_WAITS_PER_TOKEN must be at least 1"),
        ({"GRUNDLAG_MCP_RESULT_HOLD_SECONDS": "soon"}, "GRUNDLAG_MCP_RESULT_HOLD_SECONDS must be a number"),
    ],
)
def test_a_bad_limit_stops_the_process_naming_the_variable(env: dict[str, str], message: str) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG")}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_concurrent_requests_of_one_token_each_count_against_the_rate(settings: Any) -> None:
    """ninja's window was read, appended to and written back: requests at once overwrote each
    other's and a burst went past the rate. The count is one atomic increment each."""
    import threading as _threading

    from django.core.cache import cache
    from django.test import RequestFactory

    from actions.live.waiting import TokenRateThrottle

    cache.clear()
    settings.GRUNDLAG_API_RATE = "10/min"
    throttle = TokenRateThrottle()
    allowed: list[bool] = []
    start = _threading.Barrier(40)

    def one() -> None:
        request = RequestFactory().get("/api/runs")
        request.auth = ApiToken(pk=991, name="burst")  # type: ignore[attr-defined]
        start.wait()
        allowed.append(throttle.allow_request(request))

    threads = [_threading.Thread(target=one) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 10
