"""The embedded setup's worker: steps run in a pool of the serving process's threads as soon as
they are queued (no broker), and `Prefer: wait` is woken by the engine's signal."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from actions import background, engine
from actions.engine import journal, queue, steps
from actions.live import waiting
from actions.models import Run, Team
from grundlag_site.celery import run_tasks_where_sent

# Transactional: the embedded pool runs steps on its own threads and connections.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pool(settings: Any) -> Iterator[ThreadPoolExecutor]:
    """As `manage.py serve` without a broker: no Celery worker at all (a step sent to Celery
    would wait forever), a pool of step threads instead."""
    settings.GRUNDLAG_INLINE_STEPS = False
    eager = run_tasks_where_sent(False)
    executor = ThreadPoolExecutor(2, thread_name_prefix="grundlag-step")
    queue.run_steps_in(executor)
    try:
        yield executor
    finally:
        queue.run_steps_in(None)
        executor.shutdown(wait=True)
        run_tasks_where_sent(eager)


class Recording(Executor):
    """An executor that only notes what it was given."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Any, ...]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.submitted.append(args)
        return None


def settled(run_id: int, timeout: float = 10) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.is_settled:
            return run
        time.sleep(0.01)
    raise AssertionError(f"run {run_id} did not settle: {Run.objects.get(pk=run_id).status}")


def test_a_queued_step_runs_in_the_pool_as_its_transaction_commits(
    pool: ThreadPoolExecutor, team: Team, reviewer: User
) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "E-1", "amount": 2}, team, reviewer)
    assert settled(run.pk).status == "interrupted"
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True}, reviewer)
    assert settled(run.pk).status == "completed"
    kinds = list(run.events.order_by("id").values_list("kind", flat=True))
    assert kinds == ["started", "claimed", "interrupted", "approved", "resumed", "claimed", "completed"]


def test_a_step_is_handed_to_the_pool_only_once_its_transaction_commits(
    settings: Any, team: Team, reviewer: User
) -> None:
    settings.GRUNDLAG_INLINE_STEPS = False
    recording = Recording()
    queue.run_steps_in(recording)
    try:
        with transaction.atomic():
            run = engine.start_run("send_invoice", {"invoice_id": "E-3", "amount": 2}, team, reviewer)
            assert recording.submitted == [], "not before the commit: the step would not find the run"
        assert [(task, task_args) for task, task_args, _ in recording.submitted] == [
            (background.RUN_STEP, (run.pk,))
        ]
        with pytest.raises(RuntimeError, match="rolled back"), transaction.atomic():
            engine.start_run("send_invoice", {"invoice_id": "E-4", "amount": 2}, team, reviewer)
            raise RuntimeError("rolled back")
        assert len(recording.submitted) == 1, "a rolled-back run queues nothing"
    finally:
        queue.run_steps_in(None)


def test_a_step_queued_while_the_server_stops_stays_queued_for_the_next_start(
    pool: ThreadPoolExecutor, team: Team, reviewer: User
) -> None:
    pool.shutdown(wait=True)
    run = engine.start_run("send_invoice", {"invoice_id": "E-5", "amount": 2}, team, reviewer)
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert engine.sweep(all_unfinished=True) == 1  # what the next start does


def test_without_a_pool_a_step_goes_to_celery(
    settings: Any, team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actions import tasks

    settings.GRUNDLAG_INLINE_STEPS = False
    sent: list[tuple[tuple[int, ...], dict[str, Any]]] = []
    monkeypatch.setattr(tasks.run_step, "apply_async", lambda args, headers: sent.append((args, headers)))
    run = engine.start_run("send_invoice", {"invoice_id": "E-2", "amount": 2}, team, reviewer)
    assert [args for args, _ in sent] == [(run.pk,)] and Run.objects.get(pk=run.pk).status == "queued"
    # When it was sent, for the queue-wait figure: a header, which workers of any version accept.
    assert 0 <= time.time() - float(sent[0][1][background.QUEUED_AT]) < 5


async def test_a_waiting_api_request_answers_as_soon_as_the_run_changes_not_at_its_next_poll(
    team: Team, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """With the fallback poll made slower than the test's patience, only the signal can make
    the request answer in time."""
    from asgiref.sync import sync_to_async
    from django.test import RequestFactory

    from actions.api import responses as api

    monkeypatch.setattr(waiting, "FAST_POLL_SECONDS", (60.0, 60.0))
    settings.GRUNDLAG_WAIT_POLL_SECONDS = 60.0
    run = await sync_to_async(Run.objects.create)(
        action="send_invoice", input={"invoice_id": "W-1", "amount": 1}, team=team
    )
    request = RequestFactory().get("/", headers={"Prefer": "wait=20"})

    def the_engine_records_the_step() -> None:
        time.sleep(0.3)
        Run.objects.filter(pk=run.pk).update(status="completed", output={"ok": True})
        journal.run_changed.send(Run, team_id=team.pk, run_id=run.pk, status="completed", finished=True)

    recorder = threading.Thread(target=the_engine_records_the_step)
    began = time.monotonic()
    recorder.start()
    response = await api.settled_response(request, lambda: run.pk)
    recorder.join()
    assert response.status_code == 200 and response.value["status"] == "completed"
    assert time.monotonic() - began < 5
    assert run.pk not in waiting._waiters


async def test_settle_reads_what_changed_before_it_joined_and_crosses_to_the_thread_twice(
    team: Team, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """``act`` makes its change, and the run may change again before the waiter joins (a step
    in another thread): the first read, after the join, finds it. A run that settles after one
    wake-up costs two crossings to the request's thread: act with the first read, then the
    read with the description."""
    from asgiref.sync import sync_to_async

    monkeypatch.setattr(waiting, "FAST_POLL_SECONDS", (60.0, 60.0))
    settings.GRUNDLAG_WAIT_POLL_SECONDS = 60.0
    crossings: list[str] = []

    def counted(func: Any) -> Any:
        crossings.append(func.__name__)
        return sync_to_async(func)

    monkeypatch.setattr(waiting, "sync_to_async", counted)
    run = await sync_to_async(Run.objects.create)(action="send_invoice", input={}, team=team)

    def completed_unannounced() -> int:
        Run.objects.filter(pk=run.pk).update(status="completed")  # no signal: only a read finds it
        return run.pk

    described = await waiting.settle(completed_unannounced, 20, Run.SETTLED, lambda it: it.status)
    assert described == "completed" and crossings == ["first"]
    assert run.pk not in waiting._waiters

    crossings.clear()
    await sync_to_async(Run.objects.filter(pk=run.pk).update)(status="running")

    def the_engine_records_the_step() -> None:
        time.sleep(0.3)
        Run.objects.filter(pk=run.pk).update(status="interrupted")
        journal.run_changed.send(Run, team_id=team.pk, run_id=run.pk, status="interrupted", finished=False)

    recorder = threading.Thread(target=the_engine_records_the_step)
    recorder.start()
    described = await waiting.settle(lambda: run.pk, 20, Run.SETTLED, lambda it: it.status)
    recorder.join()
    assert described == "interrupted" and crossings == ["first", "read"]
    assert run.pk not in waiting._waiters


async def test_settle_without_a_wait_joins_nothing_and_a_cancelled_one_leaves_nothing_behind(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `Prefer: wait`: one read, no waiter. A request cancelled (its client gone) while its
    thread still makes its change does not leave that thread to join the run's waiters after
    the request has ended."""
    from asgiref.sync import sync_to_async

    run = await sync_to_async(Run.objects.create)(action="send_invoice", input={}, team=team)
    joined: list[int] = []

    def act() -> int:
        joined.append(len(waiting._waiters.get(run.pk, ())))
        return run.pk

    assert await waiting.settle(act, 0, Run.SETTLED, lambda it: it.status) == "queued"
    assert joined == [0] and run.pk not in waiting._waiters

    acting, go_on, tried_to_join = threading.Event(), threading.Event(), threading.Event()
    join = waiting._Waiter.join

    def joining(self: Any, run_id: int) -> None:
        join(self, run_id)
        tried_to_join.set()

    monkeypatch.setattr(waiting._Waiter, "join", joining)

    def slow_act() -> int:
        acting.set()
        assert go_on.wait(10)
        return run.pk

    request = asyncio.create_task(waiting.settle(slow_act, 20, Run.SETTLED, lambda it: it))
    assert await asyncio.to_thread(acting.wait, 10)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    go_on.set()  # the thread goes on, and reaches the join after the request has left
    assert await asyncio.to_thread(tried_to_join.wait, 10)
    assert run.pk not in waiting._waiters


async def test_a_waiting_request_is_woken_by_the_engines_signal_from_another_thread() -> None:
    async with waiting.changes_of(41) as changed, waiting.changes_of(42) as other:
        sender = threading.Thread(
            target=lambda: journal.run_changed.send(
                Run, team_id=1, run_id=41, status="completed", finished=True
            )
        )
        sender.start()
        await asyncio.wait_for(changed.wait(), timeout=2)
        sender.join()
        assert not other.is_set(), "only the waiters of that run"
    assert 41 not in waiting._waiters and 42 not in waiting._waiters


async def test_a_waiter_is_woken_only_by_a_change_to_a_status_it_waits_for() -> None:
    """A start waits for its run to settle: the claim (queued to running) does not make it read
    its run; the pause does."""
    async with waiting.changes_of(43, Run.SETTLED) as settled, waiting.changes_of(43) as any_change:
        journal.run_changed.send(Run, team_id=1, run_id=43, status="running", finished=False)
        await asyncio.wait_for(any_change.wait(), timeout=2)
        await asyncio.sleep(0.05)
        assert not settled.is_set(), "the claim woke a waiter for the run to settle"
        journal.run_changed.send(Run, team_id=1, run_id=43, status="interrupted", finished=False)
        await asyncio.wait_for(settled.wait(), timeout=2)
    assert 43 not in waiting._waiters


def test_the_heartbeat_renews_only_the_leases_this_process_still_holds(team: Team) -> None:
    from datetime import timedelta

    from django.utils import timezone

    past = timezone.now() - timedelta(seconds=5)
    mine = Run.objects.create(
        action="send_invoice", input={}, team=team, status="running", attempt=3, lease_expires_at=past
    )
    taken_over = Run.objects.create(
        action="send_invoice", input={}, team=team, status="running", attempt=2, lease_expires_at=past
    )
    stale = Run(pk=taken_over.pk, attempt=1)  # the sweeper re-queued it; another worker runs attempt 2
    steps._hold(mine)
    steps._hold(stale)
    try:
        assert steps.renew_leases() == 1
    finally:
        steps._let_go(mine)
        steps._let_go(stale)
    mine.refresh_from_db()
    taken_over.refresh_from_db()
    assert mine.lease_expires_at is not None and mine.lease_expires_at > timezone.now()
    assert taken_over.lease_expires_at == past
    assert steps.renew_leases() == 0  # let go: nothing held, nothing renewed


def test_only_a_step_still_running_whose_lease_was_taken_is_called_lost(
    team: Team, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat reads which steps run here, then renews them: a step that recorded its
    result in between is no longer running, so not renewed, but lost nothing. Under load the
    heartbeat said so of finished steps ("their results will not be recorded")."""
    from datetime import timedelta

    from django.utils import timezone

    past = timezone.now() - timedelta(seconds=5)
    finished = Run.objects.create(
        action="send_invoice", input={}, team=team, status="running", attempt=1, lease_expires_at=past
    )
    taken = Run.objects.create(
        action="send_invoice", input={}, team=team, status="running", attempt=1, lease_expires_at=past
    )
    steps._hold(finished)
    steps._hold(taken)
    try:
        # As the step does before its record commits; then the record and the sweeper's
        # re-queue land before the heartbeat's update.
        steps._recording(finished)
        Run.objects.filter(pk=finished.pk).update(status="completed", lease_expires_at=None)
        Run.objects.filter(pk=taken.pk).update(status="queued", lease_expires_at=None)
        with caplog.at_level("WARNING", logger="actions.engine.steps"):
            assert steps.renew_leases() == 0
            assert steps.renew_leases() == 0  # told once
    finally:
        steps._let_go(finished)
        steps._let_go(taken)
    lost = [
        record.getMessage()
        for record in caplog.records
        # Not the heartbeat thread's own beats, if one runs meanwhile (it sees other rows).
        if "lost its lease" in record.getMessage() and record.thread == threading.get_ident()
    ]
    assert lost == [
        f"run {taken.pk}: its step lost its lease (re-queued by the sweeper after a stall);"
        " its result will not be recorded"
    ]


def test_the_heartbeat_outlives_a_failure_to_close_its_connections(
    team: Team, monkeypatch: Any, settings: Any
) -> None:
    """Closing the heartbeat thread's old connections raised out of its loop, and ended it:
    the steps running in the process were no longer renewed (seen in the test suite, where
    pytest-django refuses a finished test's database)."""

    def refused() -> None:
        raise RuntimeError("Database access not allowed")

    monkeypatch.setattr(steps, "close_old_connections", refused)
    settings.GRUNDLAG_STEP_LEASE_SECONDS = 0.3  # a beat every 0.1 s
    monkeypatch.setattr(steps, "_heartbeat", None)  # a thread of this test's
    run = Run.objects.create(action="send_invoice", input={}, team=team, status="running", attempt=1)
    steps._hold(run)
    try:
        beating = steps._heartbeat
        assert beating is not None
        time.sleep(0.5)
        assert beating.is_alive(), "the heartbeat ended"
    finally:
        steps._let_go(run)


def test_a_step_stuck_beyond_the_longest_a_step_may_take_is_no_longer_renewed(
    team: Team, settings: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    settings.GRUNDLAG_MAX_STEP_SECONDS = 1
    past = timezone.now() - timedelta(seconds=5)
    stuck = Run.objects.create(
        action="send_invoice", input={}, team=team, status="running", attempt=1, lease_expires_at=past
    )
    steps._hold(stuck)
    try:
        assert steps.renew_leases() == 1
        time.sleep(1.1)
        assert steps.renew_leases() == 0  # its lease runs out; the sweeper re-queues it
    finally:
        steps._let_go(stuck)


@pytest.mark.parametrize("stuck", [True, False], ids=["a-thread-stuck", "none-stuck"])
def test_serve_exits_soon_even_when_a_request_thread_cannot_finish(stuck: bool) -> None:
    """The backstop behind the drain: a thread that waits for ever (a request that outlived
    the drain, its event loop gone) holds the exit EXIT_SECONDS, not until a SIGKILL; without
    one, the process exits as usual, saying nothing."""
    code = (
        "import threading; threading.Thread(target=threading.Event().wait).start(); " if stuck else ""
    ) + "from actions.management.commands.serve import leave; leave(); print('left')"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "left" in result.stdout  # the exit's usual path first
    assert ("exiting without them" in result.stderr) is stuck, result.stderr
    assert time.monotonic() - started < 20
