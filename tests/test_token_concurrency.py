"""One token's requests under way at once are capped before anything runs (issue 35): past
GRUNDLAG_MAX_REQUESTS_PER_TOKEN the next gets 429 with Retry-After at once, another token's
requests go on, and a place is given back however a request ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actions.web.middleware import TokenConcurrency


class Held:
    """An app whose requests stay under way until released (or fail, when told to)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.entered += 1
        await self.release.wait()
        if scope["path"] == "/api/fails":
            raise RuntimeError("the view failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def request(
    app: Any, token: str, path: str = "/api/runs", scheme: str = "Bearer"
) -> tuple[int, dict[bytes, bytes]]:
    scope = {
        "type": "http",
        "path": path,
        "method": "GET",
        "headers": [(b"authorization", f"{scheme} {token}".encode())],
    }
    said: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        said.append(message)

    try:
        await app(scope, receive, send)
    except RuntimeError:
        return 500, {}
    return int(said[0]["status"]), dict(said[0]["headers"])


@pytest.mark.asyncio
async def test_a_token_past_its_requests_under_way_gets_429_and_others_go_on(settings: Any) -> None:
    settings.GRUNDLAG_MAX_REQUESTS_PER_TOKEN = 3
    inner = Held()
    app = TokenConcurrency(inner)
    held = [
        asyncio.create_task(request(app, "flood", "/api/fails" if n == 0 else "/api/runs")) for n in range(3)
    ]
    await asyncio.sleep(0.05)
    assert inner.entered == 3
    status, headers = await asyncio.wait_for(request(app, "flood"), 1)
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert inner.entered == 3  # refused before the app saw it
    other = asyncio.create_task(request(app, "payroll"))
    await asyncio.sleep(0.05)
    assert inner.entered == 4  # another token is not held back
    inner.release.set()
    assert sorted(status for status, _ in await asyncio.gather(*held)) == [200, 200, 500]
    assert (await other)[0] == 200
    assert app.under_way.held == {}  # every place given back, the failed request's too
    assert (await request(app, "flood"))[0] == 200


@pytest.mark.asyncio
async def test_pages_and_requests_without_a_token_are_not_counted(settings: Any) -> None:
    settings.GRUNDLAG_MAX_REQUESTS_PER_TOKEN = 1
    inner = Held()
    inner.release.set()
    app = TokenConcurrency(inner)
    assert (await request(app, "x", "/inbox/"))[0] == 200
    assert app.under_way.held == {}


@pytest.mark.asyncio
async def test_one_token_spelt_differently_is_still_one_token(settings: Any) -> None:
    settings.GRUNDLAG_MAX_REQUESTS_PER_TOKEN = 1
    inner = Held()
    app = TokenConcurrency(inner)
    held = asyncio.create_task(request(app, "flood"))
    await asyncio.sleep(0.05)
    for spelt in ("bearer", "BEARER", "Bearer "):
        assert (await asyncio.wait_for(request(app, "flood", scheme=spelt), 1))[0] == 429, spelt
    inner.release.set()
    await held


@pytest.mark.asyncio
async def test_a_request_answered_is_no_longer_under_way_though_the_app_goes_on(settings: Any) -> None:
    # A client that has its answer sends the next at once; the app may still be closing (its
    # database connection given back): that must not count against the token.
    settings.GRUNDLAG_MAX_REQUESTS_PER_TOKEN = 1
    closing = asyncio.Event()

    async def answers_then_closes(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        await closing.wait()

    app = TokenConcurrency(answers_then_closes)
    first = asyncio.create_task(request(app, "gl_one"))
    await asyncio.sleep(0.05)
    assert not first.done(), "still closing"
    assert app.under_way.held == {}
    closing.set()
    assert (await first)[0] == 200

    # One still answering holds its place until its last body.
    inner = Held()
    app = TokenConcurrency(inner)
    held = asyncio.create_task(request(app, "gl_one"))
    await asyncio.sleep(0.05)
    assert (await request(app, "gl_one"))[0] == 429
    inner.release.set()
    assert (await held)[0] == 200 and app.under_way.held == {}
