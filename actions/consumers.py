"""The reviewers' websocket: one socket per page, joined to the group of each of the user's
teams. Frames are hints ("interrupt 7 of run 3 was approved"); the page refetches what it shows
over HTTP, so a frame lost while offline loses nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer

from actions import live
from actions.models import Team

# A client has nothing to say beyond "ping"; anything bigger than this is not ours.
MAX_FRAME_BYTES = 4096
NOT_AUTHENTICATED = 4401


class InboxConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=NOT_AUTHENTICATED)
            return
        if isinstance(self.channel_layer, InMemoryChannelLayer):
            live.bind_loop(asyncio.get_running_loop())
        self.groups_joined = await self.team_groups(user)
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json({"event": "hello", "teams": len(self.groups_joined)})

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

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
    def team_groups(self, user: Any) -> list[str]:
        return [live.team_group(pk) for pk in Team.objects.filter(members=user).values_list("pk", flat=True)]
