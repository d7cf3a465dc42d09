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

# How long joining a run's group may take before the request waits by polling instead.
JOIN_SECONDS = 1.0

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
    listener = None
    with _lock:
        _waiters.setdefault(run_id, set()).add(entry)
    try:
        listener = await _Listener.joined(run_id)
        yield entry[1]
    finally:
        with _lock:
            waiting = _waiters.get(run_id)
            if waiting is not None:
                waiting.discard(entry)
                if not waiting:
                    del _waiters[run_id]
        if listener is not None:
            await listener.leave(run_id)


class _Listener:
    """With a shared channel layer (Redis), this process's ear for the runs its requests wait
    on: one channel, in the groups of those runs (each joined once, however many wait on it),
    and one task that wakes the waiters of the run a message names. One channel for all, so a
    message that arrives just as the last waiter leaves lands in a buffer that is read, not in
    one left behind."""

    _current: _Listener | None = None

    def __init__(self, layer: Any, channel: str, loop: asyncio.AbstractEventLoop) -> None:
        self.layer, self.channel, self.loop = layer, channel, loop
        self.members: dict[int, int] = {}  # run id -> waiters in this process
        self.receiver = loop.create_task(self.receive())

    @classmethod
    async def joined(cls, run_id: int) -> _Listener | None:
        """The listener, in the run's group. None with the in-memory layer (it reaches only this
        process, where the engine's signal already does) or when the layer cannot be reached
        (the poll then covers it)."""
        layer = get_channel_layer()
        if layer is None or isinstance(layer, InMemoryChannelLayer):
            return None
        loop = asyncio.get_running_loop()
        try:
            listener = cls._current
            if listener is None or listener.loop is not loop or listener.receiver.done():
                listener = cls._current = cls(layer, await layer.new_channel(), loop)
        except Exception:
            logger.warning("cannot listen for run %s; waiting by polling", run_id, exc_info=True)
            return None
        listener.members[run_id] = listener.members.get(run_id, 0) + 1
        if listener.members[run_id] == 1:
            try:
                # Bounded: an unreachable Redis must not hold the request past its wait.
                async with asyncio.timeout(JOIN_SECONDS):
                    await layer.group_add(live.run_group(run_id), listener.channel)
            except BaseException as exc:
                listener.members.pop(run_id, None)
                if not isinstance(exc, Exception):
                    raise  # cancelled: the request went away
                logger.warning("cannot listen for run %s; waiting by polling", run_id, exc_info=True)
                return None
        return listener

    async def leave(self, run_id: int) -> None:
        left = self.members.get(run_id, 0) - 1
        if left > 0:
            self.members[run_id] = left
            return
        self.members.pop(run_id, None)
        try:
            await self.layer.group_discard(live.run_group(run_id), self.channel)
        except Exception:
            logger.warning("could not leave the group of run %s; it expires", run_id, exc_info=True)

    async def receive(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("waiting requests' channel failed; they poll meanwhile", exc_info=True)
                await asyncio.sleep(1)
                continue
            run_id = message.get("run_id")
            if isinstance(run_id, int):
                on_run_changed(None, run_id=run_id)
