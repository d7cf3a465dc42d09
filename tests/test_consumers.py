"""The reviewers' websocket, with channels' WebsocketCommunicator and the in-memory layer."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.test import Client

from actions import engine
from actions.models import Interrupt, Run, Team
from actions.web.consumers import InboxConsumer
from grundlag_site.asgi import application

# Transactional: sockets are served on another thread (channels' database_sync_to_async),
# which must see the test's commits.
pytestmark = pytest.mark.django_db(transaction=True)


async def connect(user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(InboxConsumer.as_asgi(), "/ws/inbox/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_json_from() == {"event": "hello", "teams": 1}
    return communicator


@database_sync_to_async
def start_invoice(team: Team) -> Interrupt:
    run = engine.start_run("send_invoice", {"invoice_id": "I-1", "amount": 1}, team, None, Run.Consumer.API)
    return run.interrupts.get()


async def frames_until(communicator: WebsocketCommunicator, event: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = await communicator.receive_json_from(timeout=20)
        frames.append(frame)
        if frame["event"] == event:
            return frames


async def test_anonymous_connections_are_refused() -> None:
    communicator = WebsocketCommunicator(InboxConsumer.as_asgi(), "/ws/inbox/")
    communicator.scope["user"] = AnonymousUser()
    connected, code = await communicator.connect()
    assert not connected and code == 4401


async def test_foreign_origins_are_refused() -> None:
    communicator = WebsocketCommunicator(
        application, "/ws/inbox/", headers=[(b"origin", b"http://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert not connected


async def test_a_new_interrupt_and_its_decision_reach_the_team_and_no_one_else(
    team: Team, reviewer: User, second_reviewer: User, outsider: User
) -> None:
    mine, colleague, stranger = (
        await connect(reviewer),
        await connect(second_reviewer),
        await connect(outsider),
    )

    interrupt = await start_invoice(team)
    for communicator in (mine, colleague):
        frame = (await frames_until(communicator, "interrupt"))[-1]
        sent_at, html = frame.pop("at"), frame.pop("html")
        assert frame.pop("id")
        assert frame == {
            "event": "interrupt",
            "run_id": interrupt.run_id,
            "interrupt_id": interrupt.pk,
            "status": "pending",
            "action": "send_invoice",
            "before": [],
            "after": [team.pk],
            "seq": {str(team.pk): 1},
        }
        assert 0 <= time.time() - sent_at < 5
        # The row as the inbox lists it, rendered once for every page.
        assert html.startswith(f'<tr id="interrupt-{interrupt.pk}"') and interrupt.message in html

    await database_sync_to_async(engine.resume)(interrupt, {"approved": True}, reviewer)
    for communicator in (mine, colleague):
        # The inbox's frame is rendered in a thread of its own, and the run's status is not held
        # up behind it: they come in either order.
        frames = await frames_until(communicator, "decided")
        while not any(f["event"] == "run" and f["status"] == "completed" for f in frames):
            frames += await frames_until(communicator, "run")
        decided = next(f for f in frames if f["event"] == "decided")
        assert decided["interrupt_id"] == interrupt.pk
        assert (decided["status"], decided["decided_by"]) == ("approved", "reviewer1")
        # It left the team's inbox; the next number of its stream; nothing to render.
        assert (decided["before"], decided["after"], decided["seq"]) == ([team.pk], [], {str(team.pk): 2})
        assert "html" not in decided

    assert await stranger.receive_nothing(timeout=0.3)
    for communicator in (mine, colleague, stranger):
        await communicator.disconnect()


async def test_a_change_no_socket_hears_is_not_rendered(
    team: Team, other_team: Team, reviewer: User, monkeypatch: Any
) -> None:
    from actions.live import push as live

    rendered: list[int] = []
    render = live.inbox_frames

    def counted(changes: list[Any]) -> list[dict[str, Any]]:
        rendered.extend(change.interrupt_id for change in changes)
        return render(changes)

    monkeypatch.setattr(live, "inbox_frames", counted)
    mine = await connect(reviewer)  # a socket of the first team only

    unheard = await start_invoice(other_team)
    heard = await start_invoice(team)
    frame = (await frames_until(mine, "interrupt"))[-1]

    assert frame["interrupt_id"] == heard.pk
    assert rendered == [heard.pk], unheard.pk
    await mine.disconnect()


async def test_frames_never_carry_the_checkpoint(team: Team, reviewer: User) -> None:
    communicator = await connect(reviewer)

    @database_sync_to_async
    def two_pauses() -> None:
        run = engine.start_run("transfer_funds", {"amount": 5000, "to": "X"}, team, None)
        engine.resume(run.interrupts.get(), {"marker": "CHECKPOINT-MARKER"}, reviewer)

    await two_pauses()
    seen = []
    while not await communicator.receive_nothing(timeout=0.3):
        seen.append(await communicator.receive_output())
    assert seen and all("CHECKPOINT-MARKER" not in str(frame) for frame in seen)
    await communicator.disconnect()


async def test_a_ping_gets_a_pong_and_junk_is_ignored(team: Team, reviewer: User) -> None:
    communicator = await connect(reviewer)
    await communicator.send_to(text_data="ping")
    assert await communicator.receive_json_from() == {"event": "pong"}
    await communicator.send_to(text_data='{"type": "approve", "id": 1}')
    await communicator.send_to(text_data="\x00\xff not json")
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


@pytest.mark.parametrize(
    ("frame", "code"), [({"text_data": "x" * 70_000}, 4009), ({"bytes_data": b"\x00" * 10}, 4003)]
)
async def test_huge_or_binary_frames_close_the_socket(
    team: Team, reviewer: User, frame: Any, code: int
) -> None:
    communicator = await connect(reviewer)
    await communicator.send_to(**frame)
    output = await communicator.receive_output()
    assert output == {"type": "websocket.close", "code": code}
    # The server is unaffected: a new connection works.
    again = await connect(reviewer)
    await again.disconnect()


@database_sync_to_async
def session_cookie(user: User) -> tuple[Client, bytes]:
    client = Client()
    client.force_login(user)
    return client, f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect_with_session(cookie: bytes) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(
        application, "/ws/inbox/", headers=[(b"cookie", cookie), (b"origin", b"http://testserver")]
    )
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_json_from())["event"] == "hello"
    return communicator


async def test_a_logged_out_users_socket_is_closed(team: Team, reviewer: User, settings: Any) -> None:
    settings.GRUNDLAG_SOCKET_RECHECK_SECONDS = 1
    client, cookie = await session_cookie(reviewer)
    communicator = await connect_with_session(cookie)
    await database_sync_to_async(client.logout)()
    assert await communicator.receive_output(timeout=20) == {"type": "websocket.close", "code": 4401}


async def test_a_deactivated_users_socket_is_closed(team: Team, reviewer: User, settings: Any) -> None:
    settings.GRUNDLAG_SOCKET_RECHECK_SECONDS = 1
    _, cookie = await session_cookie(reviewer)
    communicator = await connect_with_session(cookie)
    await User.objects.filter(pk=reviewer.pk).aupdate(is_active=False)
    assert await communicator.receive_output(timeout=20) == {"type": "websocket.close", "code": 4401}


async def test_removal_from_a_team_stops_its_pushes_without_a_reconnect(
    team: Team, reviewer: User, settings: Any
) -> None:
    settings.GRUNDLAG_SOCKET_RECHECK_SECONDS = 1
    _, cookie = await session_cookie(reviewer)
    communicator = await connect_with_session(cookie)
    await database_sync_to_async(team.members.remove)(reviewer)
    assert await communicator.receive_json_from(timeout=20) == {"event": "hello", "teams": 0}
    await start_invoice(team)
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


async def test_a_change_of_access_reaches_open_sockets_at_once_not_at_their_next_check(
    team: Team, reviewer: User, settings: Any
) -> None:
    """With the periodic re-check an hour away, removal from the team, deactivation and logout
    each act on the user's open sockets within a second."""
    settings.GRUNDLAG_SOCKET_RECHECK_SECONDS = 3600
    client, cookie = await session_cookie(reviewer)
    removed = await connect_with_session(cookie)
    await database_sync_to_async(team.members.remove)(reviewer)
    assert await removed.receive_json_from(timeout=1) == {"event": "hello", "teams": 0}
    await start_invoice(team)
    assert await removed.receive_nothing(timeout=0.5), "no row of a team left"
    await database_sync_to_async(team.members.add)(reviewer)
    assert await removed.receive_json_from(timeout=1) == {"event": "hello", "teams": 1}

    logged_out = await connect_with_session(cookie)
    await database_sync_to_async(client.logout)()
    for communicator in (removed, logged_out):
        assert await communicator.receive_output(timeout=1) == {"type": "websocket.close", "code": 4401}

    _, cookie = await session_cookie(reviewer)
    deactivated = await connect_with_session(cookie)
    reviewer.is_active = False
    await reviewer.asave()  # as the admin's "active" box does
    assert await deactivated.receive_output(timeout=1) == {"type": "websocket.close", "code": 4401}


async def test_a_run_page_socket_stops_hearing_the_run_when_its_user_leaves_the_team(
    team: Team, reviewer: User, settings: Any
) -> None:
    settings.GRUNDLAG_SOCKET_RECHECK_SECONDS = 1
    first = await start_invoice(team)
    _, cookie = await session_cookie(reviewer)
    communicator = await connect_with_session(cookie)
    await communicator.send_to(text_data=json.dumps({"watch_run": first.run_id}))
    assert await communicator.receive_json_from() == {"event": "watching", "run_id": first.run_id}
    await database_sync_to_async(team.members.remove)(reviewer)
    frames = [await communicator.receive_json_from(timeout=20) for _ in range(2)]
    assert {"event": "watching", "run_id": None} in frames
    await database_sync_to_async(engine.cancel)(Run(pk=first.run_id), None)
    assert await communicator.receive_nothing(timeout=0.5), "nothing of the run reaches it any more"
    await communicator.disconnect()


async def test_inbox_sockets_hear_interrupts_but_only_run_pages_hear_run_steps(
    team: Team, reviewer: User, outsider: User
) -> None:
    inbox, run_page, stranger = await connect(reviewer), await connect(reviewer), await connect(outsider)
    first = await start_invoice(team)
    for communicator in (inbox, run_page, stranger):
        while not await communicator.receive_nothing(timeout=0.2):
            await communicator.receive_output()
    # The run page asks for its run; a stranger asking for it is refused.
    await run_page.send_to(text_data=json.dumps({"watch_run": first.run_id}))
    assert await run_page.receive_json_from() == {"event": "watching", "run_id": first.run_id}
    await stranger.send_to(text_data=json.dumps({"watch_run": first.run_id}))
    assert await stranger.receive_json_from() == {"event": "watching", "run_id": None}

    await database_sync_to_async(engine.resume)(first, {"approved": True}, reviewer)

    async def events(communicator: WebsocketCommunicator) -> list[tuple[str, str]]:
        seen = []
        while not await communicator.receive_nothing(timeout=0.3):
            frame = await communicator.receive_json_from()
            seen.append((frame["event"], frame["status"]))
        return seen

    # A run's statuses arrive in order; the inbox change, rendered in the push thread, may come
    # before or after them.
    def by_kind(seen: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        return [e for e in seen if e[0] == "run"], [e for e in seen if e[0] != "run"]

    assert by_kind(await events(run_page)) == (
        [("run", "running"), ("run", "completed")],
        [("decided", "approved")],
    )
    assert by_kind(await events(inbox)) == ([("run", "completed")], [("decided", "approved")])
    assert await events(stranger) == []
    for communicator in (inbox, run_page, stranger):
        await communicator.disconnect()


async def test_each_recheck_says_where_the_users_team_streams_are(
    team: Team, reviewer: User, settings: Any
) -> None:
    """What a page checks its list against: a push lost on the way (a Redis restart) shows as
    a list behind these numbers, though nothing comes after it."""
    settings.GRUNDLAG_SOCKET_RECHECK_SECONDS = 1
    _, cookie = await session_cookie(reviewer)
    communicator = await connect_with_session(cookie)  # its hello said
    interrupt = await start_invoice(team)
    frames = await frames_until(communicator, "interrupt")
    frames += await frames_until(communicator, "stream")
    (pushed,) = [frame for frame in frames if frame.get("interrupt_id") == interrupt.pk]
    assert frames[-1] == {"event": "stream", "streams": {str(team.pk): pushed["seq"][str(team.pk)]}}
    await communicator.disconnect()
