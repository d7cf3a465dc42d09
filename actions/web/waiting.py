"""`Prefer: wait` without polling: an API request waiting for a run to settle is woken by the
engine's run_changed signal (sent after commit in the process that made the change), then
reads the row, which stays the truth. A change made in another process (a Celery worker of the
scaled setup) sends no signal here: the waiter's timeout is then the poll that finds it.

A wake-up across processes through the channel layer was tried (joining the run's group on
Redis pub/sub) and taken out: in one CI run it missed every push, and why is not known yet."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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
    try:
        yield entry[1]
    finally:
        with _lock:
            waiting = _waiters.get(run_id)
            if waiting is not None:
                waiting.discard(entry)
                if not waiting:
                    del _waiters[run_id]
