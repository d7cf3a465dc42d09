"""Pushes through Redis pub/sub (the scaled setup's channel layer, a real Redis) go to the groups
a socket somewhere listens to; a change no one hears is not read, rendered or sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from actions import engine
from actions.live import push as live
from actions.models import Interrupt, Run, Team
from tests.integration.services import Redis

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def not_resting() -> Iterator[None]:
    """Each test starts with the threads' Redis client in use (a failure rests it)."""
    live._resting_until = 0.0
    yield
    live._resting_until = 0.0


@pytest.fixture(params=["asgi", "tenant-a"])
def pubsub_layer(redis_server: Redis, settings: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The scaled setup's layer; also with a prefix of its own (several sites on one Redis)."""
    config: dict[str, Any] = {"hosts": [redis_server.url]}
    if request.param != "asgi":
        config["prefix"] = request.param
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": config}
    }
    yield get_channel_layer()


@database_sync_to_async
def start_invoice(team: Team) -> Interrupt:
    run = engine.start_run("send_invoice", {"invoice_id": "I-1", "amount": 1}, team, None, Run.Consumer.API)
    return run.interrupts.get()


async def test_a_change_reaches_the_groups_listened_to_and_one_no_one_hears_is_not_rendered(
    pubsub_layer: Any, team: Team, other_team: Team, monkeypatch: Any
) -> None:
    rendered: list[list[int]] = []
    render = live.inbox_frames

    def counted(changes: list[Any]) -> list[dict[str, Any]]:
        rendered.append([change.interrupt_id for change in changes])
        return render(changes)

    monkeypatch.setattr(live, "inbox_frames", counted)
    channel = await pubsub_layer.new_channel()
    await pubsub_layer.group_add(live.team_group(team.pk), channel)
    try:
        groups = [live.team_group(team.pk), live.team_group(other_team.pk), live.run_group(1)]
        assert await asyncio.to_thread(live.heard, groups) == {live.team_group(team.pk)}

        unheard = await start_invoice(other_team)
        heard = await start_invoice(team)
        frame = await asyncio.wait_for(pubsub_layer.receive(channel), 10)
        await asyncio.to_thread(lambda: live._renderer.submit(lambda: None).result())  # all sent

        assert f'"interrupt_id": {heard.pk}' in frame["text"] and "I-1" in frame["text"]
        # Only the team with a socket had its change read and rendered.
        assert rendered == [[heard.pk]], (rendered, unheard.pk)
        with pytest.raises(asyncio.TimeoutError):  # and nothing else came
            await asyncio.wait_for(pubsub_layer.receive(channel), 0.5)
    finally:
        await pubsub_layer.group_discard(live.team_group(team.pk), channel)
        await pubsub_layer.flush()


def test_a_question_redis_cannot_answer_pushes_to_every_group(settings: Any) -> None:
    """A push too many costs a frame; one too few, a stale page."""
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},  # nothing listens there
        }
    }
    groups = [live.team_group(1), live.run_group(2)]
    assert live.heard(groups) == set(groups)


async def test_a_page_watching_a_run_hears_its_status_and_a_member_is_told_to_recheck(
    pubsub_layer: Any, team: Team, reviewer: Any
) -> None:
    """Run hints and rechecks are published from the thread that committed (one round trip of
    its own), named as channels-redis names a group: a socket of the layer hears them."""
    interrupt = await start_invoice(team)
    channel = await pubsub_layer.new_channel()
    await pubsub_layer.group_add(live.run_group(interrupt.run_id), channel)
    await pubsub_layer.group_add(live.user_group(reviewer.pk), channel)
    try:
        await database_sync_to_async(engine.resume)(interrupt, {"approved": True}, reviewer)
        statuses = []
        while "completed" not in statuses:
            frame = await asyncio.wait_for(pubsub_layer.receive(channel), 10)
            statuses.append(json.loads(frame["text"]).get("status"))
        assert statuses[-1] == "completed"

        await database_sync_to_async(lambda: team.members.remove(reviewer))()
        while (message := await asyncio.wait_for(pubsub_layer.receive(channel), 10))[
            "type"
        ] != "socket.recheck":
            pass
        assert message == {"type": "socket.recheck", "ended_session": None}
    finally:
        await pubsub_layer.flush()


async def test_a_publish_that_fails_goes_through_the_layer_and_the_threads_rest(
    pubsub_layer: Any, team: Team, reviewer: Any, monkeypatch: Any
) -> None:
    """A removed member's sockets must re-check at once: when the thread's own publish fails,
    the layer sends it; and for a while no thread waits on Redis again."""
    channel = await pubsub_layer.new_channel()
    await pubsub_layer.group_add(live.user_group(reviewer.pk), channel)
    client, _ = live._pubsub_server(pubsub_layer)
    tried: list[int] = []

    def broken(**kwargs: Any) -> Any:
        tried.append(1)
        raise ConnectionError("Redis went away")

    monkeypatch.setattr(client, "pipeline", broken)
    try:
        await database_sync_to_async(lambda: team.members.remove(reviewer))()
        message = await asyncio.wait_for(pubsub_layer.receive(channel), 10)
        assert message == {"type": "socket.recheck", "ended_session": None}
        assert tried == [1]
        assert live._pubsub_server(pubsub_layer) == (None, "")  # resting: the layer sends
        assert await asyncio.to_thread(live.heard, ["team-1"]) == {"team-1"}
    finally:
        await pubsub_layer.flush()
