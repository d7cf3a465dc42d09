"""The reviewers' websocket: one socket per page, joined to the group of each of the user's
teams. Frames are hints ("interrupt 7 of run 3 was approved"); the page refetches what it shows
over HTTP, so a frame lost while offline loses nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model

from actions import live
from actions.models import Team

# A client has nothing to say beyond "ping"; anything bigger than this is not ours.
MAX_FRAME_BYTES = 4096
NOT_AUTHENTICATED = 4401


class InboxConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]
    watcher: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=NOT_AUTHENTICATED)
            return
        if isinstance(self.channel_layer, InMemoryChannelLayer):
            live.bind_loop(asyncio.get_running_loop())
        await self.join(await self.team_groups())
        await self.accept()
        await self.send_json({"event": "hello", "teams": len(self.groups_joined)})
        self.watcher = asyncio.create_task(self.watch())

    async def disconnect(self, code: int) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

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
        is still logged in, active and in the same teams."""
        while True:
            await asyncio.sleep(settings.GRUNDLAG_SOCKET_RECHECK_SECONDS)
            if not await self.still_allowed():
                await self.close(code=NOT_AUTHENTICATED)
                return
            groups = await self.team_groups()
            changed = set(groups) != set(self.groups_joined)
            await self.join(groups)
            if changed:
                await self.send_json({"event": "hello", "teams": len(groups)})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if bytes_data is not None or text_data is None or len(text_data) > MAX_FRAME_BYTES:
            await self.close(code=1009 if text_data and len(text_data) > MAX_FRAME_BYTES else 1003)
            return
        if text_data.strip() == "ping" or '"ping"' in text_data:
            await self.send_json({"event": "pong"})
        # Anything else is ignored: the socket only carries hints from the server.

    async def inbox_changed(self, event: dict[str, Any]) -> None:
        await self.send_json({key: value for key, value in event.items() if key != "type"})

    @database_sync_to_async
    def team_groups(self) -> list[str]:
        teams = Team.objects.filter(members=self.scope["user"]).values_list("pk", flat=True)
        return sorted(live.team_group(pk) for pk in teams)

    @database_sync_to_async
    def still_allowed(self) -> bool:
        user = self.scope["user"]
        session = self.scope.get("session")
        if session is None or not session.session_key or not session.exists(session.session_key):
            return False  # logged out (or the session expired and was cleared)
        if session.get(SESSION_KEY) != str(user.pk):
            return False
        return get_user_model().objects.filter(pk=user.pk, is_active=True).exists()
