"""`Prefer: wait` across processes: on PostgreSQL a trigger NOTIFYs a run's change to a status
a request waits for, as the transaction that makes it commits, and each web process LISTENs
(actions.live.waiting). The engine's in-process signal is disconnected here, so only the
database's notification can wake a waiter."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections

from actions.engine import journal, store
from actions.live import waiting
from actions.models import Run, Team

T = TypeVar("T")

# Transactional: waiters hear committed changes from other threads and connections (LISTEN/NOTIFY).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("database"),
    pytest.mark.parametrize("database", ["postgresql"], indirect=True),
]


@pytest.fixture
def no_engine_signal(database: str) -> Iterator[None]:
    journal.run_changed.disconnect(dispatch_uid="api-wait")
    try:
        yield
    finally:
        journal.run_changed.connect(waiting.on_run_changed, dispatch_uid="api-wait")


def listening(timeout: float = 10) -> None:
    waiting.listen()
    assert waiting._Listener.listening.wait(timeout), "the listener did not connect"


def in_another_thread(change: Callable[[], object]) -> None:
    """Run ``change`` on a connection of its own, as another process would; raise what it raised."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            change()
        except BaseException as exc:
            raised.append(exc)
        finally:
            connections[DEFAULT_DB_ALIAS].close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


def set_status(run: Run, status: str, *, commit: bool) -> None:
    class RolledBack(Exception):
        pass

    try:
        with journal.atomic():
            Run.objects.filter(pk=run.pk).update(status=status)
            journal.push_run_status(run, status)
            if not commit:
                raise RolledBack
    except RolledBack:
        pass


async def as_a_request(work: Awaitable[T]) -> T:
    """In a thread-sensitive context of its own, as Django's ASGI handler runs a request: its
    database work runs in a thread of that context, whose connection is closed as it ends (in
    asgiref's process-wide thread, it would outlive the test's database variant)."""
    async with ThreadSensitiveContext():
        try:
            return await work
        finally:
            await sync_to_async(lambda: connections[DEFAULT_DB_ALIAS].close())()


async def woken(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


# The tests are sync and run their waiting in asyncio.run(): under an async test, a connection
# opened in asgiref's process-wide thread outlives the test's database variant.


def test_a_committed_change_wakes_its_waiters_a_rolled_back_one_does_not(
    team: Team, no_engine_signal: None
) -> None:
    run = Run.objects.create(action="send_invoice", input={}, team=team, status="running")
    other = Run.objects.create(action="send_invoice", input={}, team=team, status="running")
    listening()
    assert waiting.covers_all_changes()

    async def wait() -> None:
        async with waiting.changes_of(run.pk) as changed, waiting.changes_of(other.pk) as unchanged:
            changed.clear()
            unchanged.clear()
            await asyncio.to_thread(in_another_thread, lambda: set_status(run, "interrupted", commit=False))
            assert not await woken(changed, 0.5), "a change that rolled back woke its waiter"
            began = time.monotonic()
            await asyncio.to_thread(in_another_thread, lambda: set_status(run, "interrupted", commit=True))
            assert await woken(changed, 5), "the committed change did not wake its waiter"
            assert time.monotonic() - began < 1
            assert not unchanged.is_set(), "only the waiters of that run"

    asyncio.run(wait())


def test_a_notification_wakes_only_the_waiters_of_the_status_it_names(
    team: Team, no_engine_signal: None
) -> None:
    """An approval's request waits for its run to finish: the pause (which settles a run, and
    wakes a request waiting for that) does not make it read the run; the end does. A
    notification without a status (from a process of an earlier version, during a rolling
    upgrade) wakes every waiter of the run."""
    run = Run.objects.create(action="send_invoice", input={}, team=team, status="running")
    listening()

    def bare_notification() -> None:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [store.RUN_CHANGED_CHANNEL, str(run.pk)])

    async def wait() -> None:
        async with (
            waiting.changes_of(run.pk, Run.FINISHED) as finished,
            waiting.changes_of(run.pk, Run.SETTLED) as settled,
        ):
            finished.clear()
            settled.clear()
            await asyncio.to_thread(in_another_thread, lambda: set_status(run, "interrupted", commit=True))
            assert await woken(settled, 5), "the pause did not wake the waiter for the run to settle"
            assert not await woken(finished, 0.5), "the pause woke a waiter for the run to finish"
            await asyncio.to_thread(in_another_thread, lambda: set_status(run, "completed", commit=True))
            assert await woken(finished, 5), "the end did not wake the waiter for the run to finish"
            finished.clear()
            await asyncio.to_thread(in_another_thread, bare_notification)
            assert await woken(finished, 5), "a notification without a status woke nobody"

    asyncio.run(wait())


def test_the_database_tells_when_a_run_settles_whoever_settles_it_and_only_then(
    team: Team, no_engine_signal: None
) -> None:
    """A trigger NOTIFYs a run's change to a status a request waits for (migration 0018): one
    made by plain SQL, outside the engine (an admin, a script), wakes the waiters as well; a
    heartbeat that only moves the lease, a write that leaves the status as it was, and a change
    to a status nobody waits for (a claim, a requeue) are not told."""
    from datetime import timedelta

    from django.utils import timezone

    run = Run.objects.create(action="send_invoice", input={}, team=team, status="running")
    listening()

    def update(**fields: Any) -> None:
        Run.objects.filter(pk=run.pk).update(**fields)

    async def wait() -> None:
        async with waiting.changes_of(run.pk) as changed:
            changed.clear()
            lease = timezone.now() + timedelta(seconds=30)
            await asyncio.to_thread(in_another_thread, lambda: update(lease_expires_at=lease))
            await asyncio.to_thread(in_another_thread, lambda: update(status="running"))
            await asyncio.to_thread(in_another_thread, lambda: update(status="queued"))
            await asyncio.to_thread(in_another_thread, lambda: update(status="running"))
            assert not await woken(changed, 0.5), "a change no request waits for was told"
            await asyncio.to_thread(in_another_thread, lambda: update(status="cancelled"))
            assert await woken(changed, 5), "a change of status by plain SQL did not wake the waiter"

    asyncio.run(wait())


def test_without_the_trigger_the_waiters_poll_fast_until_it_is_there(
    team: Team, no_engine_signal: None
) -> None:
    """A process started before `migrate` added the trigger hears of no change: it says so, and
    its waiters poll fast (covers_all_changes is false) until the trigger is there."""
    import importlib

    migration = importlib.import_module("actions.migrations.0018_run_status_notify")

    def execute(statements: list[str]) -> None:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)

    listening()
    assert waiting.covers_all_changes()
    waiting.stop_listening()
    execute(migration.DROP)
    try:
        listening()
        assert not waiting.covers_all_changes(), "no trigger, yet the waiters would poll slowly"
    finally:
        waiting.stop_listening()
        execute(migration.CREATE)
    listening()
    assert waiting.covers_all_changes()


def test_prefer_wait_answers_on_the_notification_not_on_its_fallback_poll(
    team: Team, no_engine_signal: None, settings: Any
) -> None:
    from django.test import RequestFactory

    from actions.api import responses as api

    settings.GRUNDLAG_WAIT_POLL_SECONDS = 60.0
    run = Run.objects.create(action="send_invoice", input={}, team=team, status="running")
    listening()
    request = RequestFactory().get("/", headers={"Prefer": "wait=20"})

    def another_process_records_the_step() -> None:
        time.sleep(0.3)
        set_status(run, "completed", commit=True)

    recorder = threading.Thread(target=in_another_thread, args=(another_process_records_the_step,))
    began = time.monotonic()
    recorder.start()
    response = asyncio.run(as_a_request(api.settled_response(request, lambda: run.pk)))
    recorder.join()
    assert response.status_code == 200 and response.value["status"] == "completed"
    assert time.monotonic() - began < 5


def test_a_lost_listener_connection_wakes_the_waiters_and_is_made_again(
    team: Team, no_engine_signal: None
) -> None:
    """While it is down, nothing says the waiters will hear of a change: they are woken to read
    their run, and poll fast (covers_all_changes is false) until it is back."""
    run = Run.objects.create(action="send_invoice", input={}, team=team, status="running")
    listening()

    def kill_the_listener() -> None:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                [waiting.APPLICATION_NAME],
            )
            assert cursor.fetchall() == [(True,)], "one listening connection"

    async def wait() -> None:
        async with waiting.changes_of(run.pk) as changed:
            changed.clear()
            await asyncio.to_thread(in_another_thread, kill_the_listener)
            assert await woken(changed, 5), "the waiters were not told the listener was lost"
            assert not waiting.covers_all_changes()
            await asyncio.to_thread(listening)  # made again, with backoff
            changed.clear()
            await asyncio.to_thread(in_another_thread, lambda: set_status(run, "completed", commit=True))
            assert await woken(changed, 5), "the new connection does not listen"

    asyncio.run(wait())
