"""Pushes to reviewers' browsers. A push is a hint: pages refetch over HTTP on every
(re)connect, so a push that is lost (a restart, a dropped socket) loses nothing."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

logger = logging.getLogger(__name__)

# The event loop that serves the websockets. With the in-memory channel layer, a push from
# another thread (the embedded worker) must be handed to that loop: the layer's queues are
# plain asyncio objects and would not wake a consumer waiting on another loop.
_home_loop: asyncio.AbstractEventLoop | None = None
# Elsewhere (a Celery worker, a management command), pushes go through one long-lived loop in a
# thread of its own: async_to_sync per push would start a loop (and, with channels-redis, open
# a connection) every time, which cost more than the step that pushed.
_push_loop: asyncio.AbstractEventLoop | None = None
_push_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _push_loop
    with _push_loop_lock:
        if _push_loop is None or _push_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="grundlag-push", daemon=True).start()
            _push_loop = loop
        return _push_loop


def bind_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _home_loop
    _home_loop = loop


def team_group(team_id: int) -> str:
    return f"team-{team_id}"


def run_group(run_id: int) -> str:
    """Sockets of pages that show one run (they ask for it with {"watch_run": id})."""
    return f"run-{run_id}"


def notify_team(team_id: int, event: str, **payload: Any) -> None:
    """Tell every connected reviewer of the team (and any page watching the run) that something
    changed. Never raises."""
    _send_to([team_group(team_id)], event, payload)


def notify_run(team_id: int, run_id: int, status: str, *, finished: bool) -> None:
    """A run's status changed. Only pages showing the run need to hear of it, unless it
    finished: that may have cancelled interrupts in the team's inboxes."""
    groups = [run_group(run_id), team_group(team_id)] if finished else [run_group(run_id)]
    _send_to(groups, "run", {"run_id": run_id, "status": status})


def on_team_changed(sender: Any, *, team_id: int, event: str, payload: dict[str, Any], **kwargs: Any) -> None:
    """The engine's team_changed signal (actions.engine.journal)."""
    notify_team(team_id, event, **payload)


def on_run_changed(
    sender: Any, *, team_id: int, run_id: int, status: str, finished: bool, **kwargs: Any
) -> None:
    """The engine's run_changed signal (actions.engine.journal)."""
    notify_run(team_id, run_id, status, finished=finished)


def _send_to(groups: list[str], event: str, payload: dict[str, Any]) -> None:
    # "at" (epoch seconds, when the change was committed and pushed) lets a client judge how
    # fresh a frame is; the push-latency benchmark measures from it.
    message = {"type": "inbox.changed", "event": event, "at": time.time(), **payload}
    if "run_id" in payload and event != "run":
        groups = [*groups, run_group(payload["run_id"])]
    for group in groups:
        try:
            _group_send(group, message)
        except Exception:
            logger.warning("push to %s failed; clients catch up on reconnect", group, exc_info=True)


def _group_send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _home_loop
    if loop is None and isinstance(layer, InMemoryChannelLayer):
        # The in-memory layer reaches only this process's sockets, and the first to connect
        # binds the loop: none has, so no one can hear this (a shell, a command, a benchmark).
        return
    if loop is not None and loop.is_running() and not loop.is_closed():
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            loop.create_task(layer.group_send(group, message))
        else:
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
        return
    future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _background_loop())
    future.add_done_callback(_report_failure)


def _report_failure(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("push failed; clients catch up on reconnect: %r", future.exception())
