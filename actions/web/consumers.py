"""The reviewers' websocket: one socket per page, joined to the group of each of the user's
teams (and of the run a run page shows). Inbox frames carry the change, rendered once for every
page (actions.live.push); a page that misses one sees it by the stream's numbers and refetches,
so a frame lost while offline loses nothing."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model

from actions import metrics
from actions.live import push as live
from actions.models import InboxStream, Role, Run, Team

logger = logging.getLogger(__name__)

# A client has nothing to say beyond "ping"; anything bigger than this is not ours.
MAX_FRAME_BYTES = 4096
# Application close codes (4000-4999): a server may not send the protocol's own 1003/1009
# (autobahn refuses them, raising instead of closing), so these mirror them.
NOT_AUTHENTICATED = 4401
UNSUPPORTED_DATA = 4003
TOO_BIG = 4009


class InboxConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]
    watcher: asyncio.Task[None] | None = None
    watched_run: int | None = None
    counted = False  # in the open-sockets figure
    user_group: str | None = None

    async def connect(self) -> None:
        self.groups_joined = []
        self.recent: deque[Any] = deque(maxlen=64)
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=NOT_AUTHENTICATED)
            return
        if isinstance(self.channel_layer, InMemoryChannelLayer):
            live.bind_loop(asyncio.get_running_loop())
        await self.join(await self.team_groups())
        # Told at once when the user's access changes (actions.live.push.recheck_sockets_of).
        await self.channel_layer.group_add(live.user_group(user.pk), self.channel_name)
        self.user_group = live.user_group(user.pk)
        await self.accept()
        self.counted = True
        metrics.OPEN_SOCKETS.inc()
        await self.send_json({"event": "hello", "teams": len(self.groups_joined)})
        self.watcher = asyncio.create_task(self.watch())

    async def disconnect(self, code: int) -> None:
        """Everything this socket holds is let go, each part whatever happens to the others:
        a leaked watcher or group membership would outlive the socket."""
        if self.counted:
            metrics.OPEN_SOCKETS.dec()
            self.counted = False
        if self.watcher is not None:
            self.watcher.cancel()
            self.watcher = None
        groups = list(getattr(self, "groups_joined", []))
        if self.user_group is not None:
            groups.append(self.user_group)
            self.user_group = None
        if self.watched_run is not None:
            groups.append(live.run_group(self.watched_run))
            self.watched_run = None
        self.groups_joined = []
        for group in groups:
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except Exception:
                logger.warning("could not leave %s; it expires on its own", group, exc_info=True)

    async def join(self, groups: list[str]) -> None:
        for group in set(self.groups_joined) - set(groups):
            await self.channel_layer.group_discard(group, self.channel_name)
        # group_add for groups already joined renews them: channels-redis forgets members after
        # its group expiry, and all of them when Redis restarts without persistence.
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = groups

    async def watch(self) -> None:
        """A socket outlives the request that opened it: re-check, now and then, that its user
        is still logged in, active and in the same teams (and at once when told a change of
        these was saved: socket_recheck)."""
        while True:
            await asyncio.sleep(settings.GRUNDLAG_SOCKET_RECHECK_SECONDS)
            if not await self.recheck():
                return

    async def socket_recheck(self, message: dict[str, Any]) -> None:
        session = self.scope.get("session")
        ended = message.get("ended_session")
        if ended and session is not None and session.session_key == ended:
            await self.close(code=NOT_AUTHENTICATED)
            return
        await self.recheck()

    async def recheck(self) -> bool:
        """Close the socket, or move it to the user's teams now; False once closed."""
        if not await self.still_allowed():
            await self.close(code=NOT_AUTHENTICATED)
            return False
        groups = await self.team_groups()
        changed = set(groups) != set(self.groups_joined)
        await self.join(groups)
        if self.watched_run is not None and not await self.may_see_run(self.watched_run):
            # Removed from the run's team: its frames stop with the right to see it.
            await self.channel_layer.group_discard(live.run_group(self.watched_run), self.channel_name)
            self.watched_run = None
            await self.send_json({"event": "watching", "run_id": None})
        if changed:
            await self.send_json({"event": "hello", "teams": len(groups)})
        else:
            # The teams' stream numbers now: a page whose list is behind them lost a frame with
            # nothing after it to show the gap (a push lost in a Redis restart), and fetches it.
            await self.send_json({"event": "stream", "streams": await self.team_streams()})
        return True

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None or text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self.close(
                code=TOO_BIG if text_data and len(text_data) > MAX_FRAME_BYTES else UNSUPPORTED_DATA
            )
            return
        if text_data.strip() == "ping" or '"ping"' in text_data:
            await self.send_json({"event": "pong"})
            return
        try:
            message = json.loads(text_data)
        except ValueError:
            return
        if isinstance(message, dict) and isinstance(message.get("watch_run"), int):
            await self.watch_run(message["watch_run"])
        # Anything else is ignored: the socket only carries hints from the server.

    async def watch_run(self, run_id: int) -> None:
        """A run page asks for its run's status changes; only for a run the user may see."""
        if not await self.may_see_run(run_id):
            await self.send_json({"event": "watching", "run_id": None})
            return
        if self.watched_run is not None:
            await self.channel_layer.group_discard(live.run_group(self.watched_run), self.channel_name)
        self.watched_run = run_id
        await self.channel_layer.group_add(live.run_group(run_id), self.channel_name)
        await self.send_json({"event": "watching", "run_id": run_id})

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale database connections before every handler, on a worker thread
        # (one at a time). A push touches no database and reaches every socket at once, so that
        # hop, made by each socket in turn, was most of the time a frame took to reach the
        # last of 100 reviewers (bench/push_latency.py). Pushes skip it; the rest keep it.
        if message.get("type") == "inbox.changed":
            await self.inbox_changed(message)
            return
        await super().dispatch(message)

    async def inbox_changed(self, event: dict[str, Any]) -> None:
        # A page hears a change through each of its groups that it concerns (a run page through
        # its team's and its run's; an escalated interrupt through both teams): send it once.
        key = event.get("id")
        if key in self.recent:
            return
        self.recent.append(key)
        if isinstance(event.get("text"), str):
            await self.send(text_data=event["text"])  # encoded once by the sender
        else:  # a frame from an earlier version, during a rolling deploy
            await self.send_json({key: value for key, value in event.items() if key != "type"})

    @database_sync_to_async
    def team_groups(self) -> list[str]:
        teams = Team.where(self.scope["user"], Role.WORK).values_list("pk", flat=True)
        return sorted(live.team_group(pk) for pk in teams)

    @database_sync_to_async
    def team_streams(self) -> dict[str, int]:
        rows = InboxStream.objects.filter(team__in=Team.where(self.scope["user"], Role.WORK)).values_list(
            "team_id", "seq"
        )
        return {str(team_id): int(seq) for team_id, seq in rows}

    @database_sync_to_async
    def may_see_run(self, run_id: int) -> bool:
        return Run.visible_to(self.scope["user"]).filter(pk=run_id).exists()

    @database_sync_to_async
    def still_allowed(self) -> bool:
        user = self.scope["user"]
        session = self.scope.get("session")
        if session is None or not session.session_key or not session.exists(session.session_key):
            return False  # logged out (or the session expired and was cleared)
        if session.get(SESSION_KEY) != str(user.pk):
            return False
        return get_user_model().objects.filter(pk=user.pk, is_active=True).exists()
