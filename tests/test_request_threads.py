"""Each request's synchronous part runs on a thread kept from the requests before it
(actions.web.middleware.RequestThreads), not on one made and joined for it: a thread is used by
one request at a time, one still busy with a cancelled request's work is not handed to the next,
sync code that calls back into async code and out again stays on its request's thread, and
Django's handler and the API work inside it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, cast

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.asgi import get_asgi_application
from django.core.signals import request_started

from actions.web.middleware import RequestThreads


class SyncWork:
    """An app whose request does its work in sync code, as Django's handler does, and answers
    with the thread that did it. Told to, the next request's work waits until released."""

    def __init__(self) -> None:
        self.hold_next = False
        self.release = threading.Event()
        self.started = threading.Event()

    def work(self) -> int:
        if self.hold_next:
            self.hold_next = False
            self.started.set()
            self.release.wait(20)
        return threading.get_ident()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        ident = await sync_to_async(self.work)()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(ident).encode()})


async def request(app: Any) -> int:
    said: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        said.append(message)

    await app({"type": "http", "path": "/", "method": "GET", "headers": []}, receive, send)
    return int(said[1]["body"])


@pytest.mark.asyncio
async def test_requests_one_after_another_use_one_thread_and_at_once_one_each() -> None:
    app = RequestThreads(SyncWork())
    first, second = await request(app), await request(app)
    assert first == second != threading.get_ident()
    together = await asyncio.gather(*(request(app) for _ in range(4)))
    assert len(set(together)) == 4, "each request under way at once has a thread of its own"
    assert len(app.idle) == 4


@pytest.mark.asyncio
async def test_a_thread_busy_with_a_cancelled_request_is_not_handed_to_the_next() -> None:
    inner = SyncWork()
    app = RequestThreads(inner)
    used = await request(app)
    inner.hold_next = True
    cancelled = asyncio.ensure_future(request(app))
    await asyncio.to_thread(inner.started.wait, 10)
    cancelled.cancel()  # the client went away; its sync work goes on
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert app.idle == []
    try:
        # Not queued behind the work still under way (held 20 s).
        following = await asyncio.wait_for(request(app), 10)
        assert following != used
    finally:
        inner.release.set()


class Fails:
    """An app whose request fails after its sync work (or is cancelled: the same path), which
    may have left state on its thread that nothing cleaned up."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await sync_to_async(threading.get_ident)()
        raise RuntimeError("the request failed")


@pytest.mark.asyncio
async def test_the_thread_of_a_request_that_failed_is_not_kept() -> None:
    app = RequestThreads(Fails())
    with pytest.raises(RuntimeError):
        await request(app)
    assert app.idle == []


@pytest.mark.asyncio
async def test_at_most_keep_idle_threads_are_kept() -> None:
    app = RequestThreads(SyncWork(), keep=2)
    await asyncio.gather(*(request(app) for _ in range(5)))
    assert len(app.idle) == 2


class Bridged:
    """Sync code that calls async code that calls sync code (Django's sync middleware around
    an async view that reads the database): the inner sync call runs on the request's thread."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def view() -> int:
            return await sync_to_async(threading.get_ident)()

        def middleware() -> tuple[int, int]:
            return threading.get_ident(), async_to_sync(view)()

        outer, inner = await sync_to_async(middleware)()
        assert outer == inner
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(outer).encode()})


@pytest.mark.asyncio
async def test_sync_code_calling_async_code_calling_sync_code_stays_on_the_request_thread() -> None:
    app = RequestThreads(Bridged())
    started = time.monotonic()
    first, second = await asyncio.wait_for(request(app), 10), await asyncio.wait_for(request(app), 10)
    assert first == second
    assert time.monotonic() - started < 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_django_and_the_api_run_on_a_kept_thread(token_key: str) -> None:
    """Django's handler inside it (sync middleware, the async view, the engine's reads): its
    own per-request context takes the kept thread, and requests one after another share it."""
    app = RequestThreads(get_asgi_application())
    transport = httpx.ASGITransport(app=cast(Any, app))
    headers = {"Authorization": f"Bearer {token_key}"}
    ran_on: list[str] = []

    def started(**kwargs: Any) -> None:
        ran_on.append(threading.current_thread().name)

    request_started.connect(started)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=headers) as c:
            asked = await c.post("/api/approvals", json={"message": "ship it?"})
            assert asked.status_code == 202, asked.text
            read = await c.get(f"/api/approvals/{asked.json()['id']}")
            assert read.status_code == 200 and read.json()["status"] == "pending", read.text
    finally:
        request_started.disconnect(started)
    assert len(ran_on) == 2 and ran_on[0] == ran_on[1], ran_on
    assert ran_on[0].startswith("grundlag-request"), ran_on
    assert len(app.idle) == 1
