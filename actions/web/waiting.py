"""`Prefer: wait` without polling: an API request waiting for a run to settle is woken when the
run changes, then reads the row, which stays the truth.

- A change made in this process (the embedded server's steps, a decision through this server)
  sends the engine's run_changed signal here, after commit.
- A change made in another process (a Celery worker of the scaled setup, another daphne) is
  pushed to the run's group on the channel layer (actions.web.live.notify_run, through Redis),
  which the waiting request joins for as long as it waits.

Should both be lost, the waiter's timeout is a slow poll that still finds the change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from actions.web import live

logger = logging.getLogger(__name__)

_waiters: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
_lock = threading.Lock()


def on_run_changed(sender: Any, *, run_id: int, **kwargs: Any) -> None:
    """The engine's run_changed signal, from whichever thread committed the change."""
    with _lock:
        waiters = list(_waiters.get(run_id, ()))
    for loop, event in waiters:
        # A closed loop (the server is stopping) has nobody waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)


@asynccontextmanager
async def changes_of(run_id: int) -> AsyncIterator[asyncio.Event]:
    """An event set whenever the run changes while the block runs (clear it before reading).
    Joined before the block starts, so a change after the block's first read is never missed."""
    entry = (asyncio.get_running_loop(), asyncio.Event())
    with _lock:
        _waiters.setdefault(run_id, set()).add(entry)
    listening = await _listen_across_processes(run_id, entry[1])
    try:
        yield entry[1]
    finally:
        with _lock:
            waiting = _waiters.get(run_id)
            if waiting is not None:
                waiting.discard(entry)
                if not waiting:
                    del _waiters[run_id]
        if listening is not None:
            await listening()


async def _listen_across_processes(run_id: int, event: asyncio.Event) -> Any:
    """With a shared channel layer (Redis), join the run's group; returns how to leave it. None
    with the in-memory layer (which reaches only this process, where the signal already does)
    or when the layer cannot be reached (the poll then covers it)."""
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return None
    group = live.run_group(run_id)
    try:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    except Exception:
        logger.warning("cannot join %s; waiting by polling", group, exc_info=True)
        return None

    async def receive() -> None:
        while True:
            await layer.receive(channel)
            event.set()

    receiver = asyncio.create_task(receive())

    async def leave() -> None:
        receiver.cancel()
        with contextlib.suppress(BaseException):
            await receiver
        try:
            await layer.group_discard(group, channel)
        except Exception:
            logger.warning("could not leave %s; it expires on its own", group, exc_info=True)

    return leave
