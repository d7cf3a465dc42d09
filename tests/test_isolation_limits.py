"""No token can stall the others: a rate of requests per token on the API and the MCP endpoint
(429 with Retry-After past it). Requests go through Django's ASGI handler and the MCP endpoint
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
from typing import Any, TypeVar

import httpx
import pytest
from django.core.asgi import get_asgi_application
from django.core.cache import cache
from django.test import Client

from actions import mcp
from actions.models import ApiToken, Team

pytestmark = pytest.mark.django_db(transaction=True)

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


MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-11-25",
}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


def test_mcp_answers_429_with_retry_after_past_the_tokens_rate_which_it_shares_with_the_api(
    settings: Any, token_key: str, other_token_key: str
) -> None:
    settings.GRUNDLAG_API_RATE = "2/min"

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


# The settings


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GRUNDLAG_API_RATE": "lots"}, 'GRUNDLAG_API_RATE must be a rate such as "600/min"'),
        ({"GRUNDLAG_API_RATE": "10/fortnight"}, "GRUNDLAG_API_RATE must be a rate"),
    ],
)
def test_a_bad_limit_stops_the_process_naming_the_variable(env: dict[str, str], message: str) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG")}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr
