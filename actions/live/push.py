"""Pushes to reviewers' browsers.

An inbox change is rendered once, here, for everyone: its frame carries the row's HTML (never
the checkpoint), the teams whose inbox showed it before and after, its action, and its number
in each of those teams' streams. Each page decides from that alone whether the change is in its
own view (its user's teams, its filters) and how its count moves (static/js/live.js), so the
server's work per change does not grow with the number of pages or of pending interrupts.

A page fetches its list over HTTP on (re)connect, and when a frame's number shows it missed one
(a restart, a dropped socket, a full channel): a lost push loses nothing. Frames about runs are
hints that make run and interrupt pages refetch their fragment."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings
from django.db import close_old_connections, transaction
from django.template.loader import render_to_string

from actions import engine, metrics
from actions.engine import InboxChange
from actions.models import Interrupt, Team

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


def inbox_frames(changes: list[InboxChange]) -> list[dict[str, Any]]:
    """The frames of a transaction's inbox changes: a row rendered once per change that leaves
    it in an inbox (rows that only leave inboxes, decided, need nothing read or rendered)."""
    rows = _inbox_rows(list(dict.fromkeys(change.interrupt_id for change in changes if change.after)))
    frames = []
    for change in changes:
        row = rows.get(change.interrupt_id)
        frame: dict[str, Any] = {
            "event": change.event,
            "run_id": change.run_id,
            "interrupt_id": change.interrupt_id,
            "status": change.status,
            "action": change.action,
            "before": list(change.before),
            "after": list(change.after),
            "seq": {str(team): n for team, n in change.seq.items()},
        }
        if change.decided_by:
            frame["decided_by"] = change.decided_by
        if row is not None:
            frame["html"] = render_to_string("actions/partials/inbox_row.html", {"it": row}).strip()
        frames.append(frame)
    return frames


def _inbox_rows(shown: list[int]) -> dict[int, Interrupt]:
    """The interrupts with what their inbox rows show: their runs, their teams, the teams they
    were escalated to, the approvals an N-of-M has. One, the usual (a new interrupt, on every
    push's path), is read as the engine reads; several (a delegation's, in one transaction)
    in one query. Those gone meanwhile are left out."""
    if not shown:
        return {}  # rows that only leave inboxes (decided): nothing to read or render
    if len(shown) != 1:
        return {
            it.pk: it
            for it in Interrupt.objects.filter(pk__in=shown)
            .select_related("run", "team", "escalate_to")
            .annotate(approval_count=Interrupt.approvals_counted())
        }
    it = engine.read_interrupt(shown[0])
    if it is None:
        return {}
    if it.escalate_to_id is not None:
        try:
            it.escalate_to = engine.read_team(it.escalate_to_id)
        except Team.DoesNotExist:  # deleted meanwhile: as the query's join would say
            it.escalate_to = None
    if it.approvals_required > 1:
        counted = Interrupt.objects.filter(pk=it.pk).aggregate(n=Interrupt.approvals_counted())
        it.approval_count = counted["n"]  # type: ignore[attr-defined]
    return {it.pk: it}


def notify_inboxes(changes: list[InboxChange]) -> None:
    """Send each change to the streams of its teams, and to pages showing its run: those of
    them that a page somewhere listens to, asked after the commit (``heard``). A change no
    page hears is neither read nor rendered. Never raises."""
    if not _anyone_listening():
        return
    began = time.perf_counter()
    groups_of = {id(c): [*map(team_group, c.team_ids), run_group(c.run_id)] for c in changes}
    listened = heard([group for groups in groups_of.values() for group in groups])
    changes = [change for change in changes if listened.intersection(groups_of[id(change)])]
    if not changes:
        return
    try:
        frames = inbox_frames(changes)
    except Exception:
        # Rendering failed (the database went away): pages find out from the next frame's
        # number, or when they reconnect.
        logger.warning("inbox frames could not be made; pages catch up on the next", exc_info=True)
        return
    for change, frame in zip(changes, frames, strict=True):
        _send_to([group for group in groups_of[id(change)] if group in listened], frame)
    metrics.PUSH_FANOUT.observe(time.perf_counter() - began)


# The Redis clients that ask and publish from threads, by server. Short timeouts: a push is a
# hint, and the thread that sends it (a step's, a request's) has other work. After a failure the
# threads leave Redis alone for a while (``_rest``): pushes go through the layer's event loop,
# which no thread waits for, and every group counts as heard.
_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()
SYNC_TIMEOUT_SECONDS = 0.5
REST_SECONDS = 5.0
_resting_until = 0.0


def _rest() -> None:
    global _resting_until
    if time.monotonic() >= _resting_until:
        logger.warning(
            "Redis did not answer a push in time; pushing through the channel layer for %.0f s",
            REST_SECONDS,
            exc_info=True,
        )
    _resting_until = time.monotonic() + REST_SECONDS


# A page joins its groups before it is told "hello", and fetches what it shows only then (and a
# run page its run on "watching", after joining the run's group): a change committed before a
# page joined is in what that page fetches. So a push may ask, after its commit, whether anyone
# listens, and skip what no one hears: a page that joins after the question fetches the change.
# (Asked anew for each push: an answer kept for later would miss a page that joined meanwhile.)
def heard(groups: list[str]) -> set[str]:
    """Those of ``groups`` that a page somewhere listens to, as far as the channel layer can
    tell: with Redis pub/sub (one server), one PUBSUB NUMSUB; in memory, this process's groups.
    Any other layer, or a question that failed: all of them (a push too many costs a frame, a
    push too few a stale page)."""
    layer = get_channel_layer()
    if layer is None:
        return set()
    if isinstance(layer, InMemoryChannelLayer):
        return {group for group in groups if group in layer.groups}
    client, prefix = _pubsub_server(layer)
    if client is None or not groups:
        return set(groups)
    try:
        counts = client.pubsub_numsub(*(_channel(prefix, group) for group in groups))
    except Exception:
        _rest()
        return set(groups)
    return {group for group, (_, count) in zip(groups, counts, strict=True) if count}


def _channel(prefix: str, group: str) -> str:
    """A group's Redis channel, named as channels-redis names it (RedisPubSubLoopLayer's
    _get_group_channel_name; tests/integration/test_push_heard.py holds them together)."""
    return f"{prefix}__group__{group}"


def _pubsub_server(layer: Any) -> tuple[Any, str]:
    """A client of the one Redis server of a pub/sub channel layer, and the layer's prefix;
    (None, "") for another layer, one sharded over several servers (each group on its own), or
    while resting after a failure. (One server, not a Redis Cluster, which channels-redis does
    not serve either: a node's PUBSUB NUMSUB counts only its own subscribers.)"""
    if not isinstance(layer, RedisPubSubChannelLayer) or time.monotonic() < _resting_until:
        return None, ""
    layers: dict[str, dict[str, Any]] = settings.CHANNEL_LAYERS
    config: dict[str, Any] = layers["default"].get("CONFIG") or {}
    hosts = config.get("hosts") or []
    if len(hosts) != 1 or not isinstance(hosts[0], str):
        return None, ""
    url = hosts[0]
    with _clients_lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(
                url, socket_timeout=SYNC_TIMEOUT_SECONDS, socket_connect_timeout=SYNC_TIMEOUT_SECONDS
            )
    return _clients[url], config.get("prefix", "asgi")


def user_group(user_id: int) -> str:
    """Every socket of one user: told to re-check its access when that changes."""
    return f"user-{user_id}"


def recheck_sockets_of(user_ids: list[int], *, ended_session: str | None = None) -> None:
    """Once the transaction commits, have the users' open sockets re-check their session, their
    activity and their teams at once, rather than at their next periodic check: a member removed
    from a team stops receiving its rows now. Never raises."""

    def send() -> None:
        if not _anyone_listening():
            return
        message = {"type": "socket.recheck", "ended_session": ended_session}
        if _published([user_group(user_id) for user_id in user_ids], message):
            return
        for user_id in user_ids:
            try:
                _group_send(user_group(user_id), message)
            except Exception:
                logger.warning("could not tell user %s's sockets to re-check", user_id, exc_info=True)

    transaction.on_commit(send, robust=True)


def on_membership_changed(
    sender: Any, *, instance: Any, action: str, reverse: bool, pk_set: set[int] | None, **kwargs: Any
) -> None:
    """Members added through Team.members (m2m_changed): they re-check. (add() writes its rows
    without post_save; what remove() and clear() delete sends post_delete: on_role_changed.)"""
    if action == "post_add":
        recheck_sockets_of([instance.pk] if reverse else sorted(pk_set or ()))


def on_role_changed(sender: Any, *, instance: Any, **kwargs: Any) -> None:
    """A membership saved (a new one, or its role changed) or deleted (one by one, or by
    Team.members' remove() and clear()): its user re-checks (an approver made auditor leaves
    the live inbox now)."""
    recheck_sockets_of([instance.user_id])


def on_user_saved(sender: Any, *, instance: Any, created: bool, **kwargs: Any) -> None:
    """A user saved inactive (the admin's "active" box) has their sockets closed now."""
    if not created and not instance.is_active:
        recheck_sockets_of([instance.pk])


def on_logged_out(sender: Any, *, request: Any, user: Any, **kwargs: Any) -> None:
    """Logged out: the sockets of that session close now (the session is flushed just after
    this signal, so they are named rather than left to find it gone)."""
    if user is not None:
        session = getattr(request, "session", None)
        recheck_sockets_of([user.pk], ended_session=getattr(session, "session_key", None))


def notify_run(team_id: int, run_id: int, status: str, *, finished: bool) -> None:
    """A run's status changed. Only pages showing the run need to hear of it, unless it
    finished: that may have cancelled interrupts in the team's inboxes."""
    groups = [run_group(run_id), team_group(team_id)] if finished else [run_group(run_id)]
    _send_to(groups, {"event": "run", "run_id": run_id, "status": status})


# Rendering a change's row reads the database and a template: done in a thread of its own, so
# the thread that committed (a step, a decision's request) goes on at once, and the run's
# status, which a waiting API caller wants, is not sent after it. One thread: frames leave in
# the order of the commits that made them.
_renderer = ThreadPoolExecutor(1, thread_name_prefix="grundlag-push")


def on_team_changed(sender: Any, *, changes: list[InboxChange], **kwargs: Any) -> None:
    """The engine's team_changed signal (actions.engine.journal)."""
    if not _anyone_listening():
        return
    try:
        _renderer.submit(_notify_from_renderer, changes)
    except RuntimeError:  # the interpreter is shutting down
        notify_inboxes(changes)


def _notify_from_renderer(changes: list[InboxChange]) -> None:
    try:
        notify_inboxes(changes)
    finally:
        close_old_connections()


def on_discussed(sender: Any, *, run_id: int, **kwargs: Any) -> None:
    """The engine's discussed signal: pages showing the run (and its interrupts) fetch their
    thread again."""
    _send_to([run_group(run_id)], {"event": "comment", "run_id": run_id})


def on_run_changed(
    sender: Any, *, team_id: int, run_id: int, status: str, finished: bool, **kwargs: Any
) -> None:
    """The engine's run_changed signal (actions.engine.journal)."""
    notify_run(team_id, run_id, status, finished=finished)


def _send_to(groups: list[str], frame: dict[str, Any]) -> None:
    if not _anyone_listening():
        return  # nothing to encode: no page can hear it (the engine alone, a command)
    # "at" (epoch seconds, when the change was committed and pushed) lets a client judge how
    # fresh a frame is. "id" names the frame, which a page that hears it through two of its
    # groups (its team's and its run's, or two teams') takes once.
    framed = {"at": time.time(), "id": uuid.uuid4().hex, **frame}
    # Encoded once here, not once per socket: at 1,000 sockets that was a thousand json.dumps
    # of the same frame.
    message = {"type": "inbox.changed", "id": framed["id"], "text": json.dumps(framed)}
    if _published(groups, message):
        return
    for group in groups:
        try:
            _group_send(group, message)
        except Exception:
            logger.warning("push to %s failed; clients catch up on reconnect", group, exc_info=True)


def _published(groups: list[str], message: dict[str, Any]) -> bool:
    """With Redis pub/sub, from a thread (a step's, a request's, the renderer's): published to
    every group at once, in one round trip of this thread's own. Through an event loop, each
    group's push took three times the CPU (a hop to the loop, a task, an asynchronous client's
    command) on the same server. False where that does not apply (in memory, on an event loop)
    or it failed: the caller sends it through the layer."""
    layer = get_channel_layer()
    client, prefix = _pubsub_server(layer)
    if client is None or _on_event_loop():
        return False
    data = layer.serialize(message)  # as channels-redis encodes what it publishes
    try:
        with client.pipeline(transaction=False) as pipe:
            for group in groups:
                pipe.publish(_channel(prefix, group), data)
            pipe.execute()
    except Exception:
        _rest()
        return False
    return True


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _anyone_listening() -> bool:
    """False when no page can hear a push from here: the in-memory layer reaches only this
    process's sockets, and the first to connect binds the loop; none has (a shell, a command,
    a benchmark). Then no frame is worth rendering."""
    layer = get_channel_layer()
    if layer is None:
        return False
    if isinstance(layer, InMemoryChannelLayer):
        return _home_loop is not None and _home_loop.is_running()
    return True


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
