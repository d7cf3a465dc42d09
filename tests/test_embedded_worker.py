"""The embedded setup's worker: steps run in a pool of the serving process's threads as soon as
they are queued (no broker), and `Prefer: wait` is woken by the engine's signal."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth.models import User

from actions import engine
from actions.engine import journal, steps
from actions.models import Run, Team
from actions.web import waiting
from grundlag_site.celery import app as celery_app

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pool(settings: Any) -> Iterator[ThreadPoolExecutor]:
    """As `manage.py serve` without a broker: no Celery worker at all (a step sent to Celery
    would wait forever), a pool of step threads instead."""
    settings.GRUNDLAG_INLINE_STEPS = False
    celery_app.conf.task_always_eager = False
    executor = ThreadPoolExecutor(2, thread_name_prefix="grundlag-step")
    steps.run_steps_in(executor)
    yield executor
    steps.run_steps_in(None)
    executor.shutdown(wait=True)
    celery_app.conf.task_always_eager = True


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


def test_without_a_pool_a_step_goes_to_celery(
    settings: Any, team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actions import tasks

    settings.GRUNDLAG_INLINE_STEPS = False
    sent: list[int] = []
    monkeypatch.setattr(tasks.run_step, "delay", sent.append)
    run = engine.start_run("send_invoice", {"invoice_id": "E-2", "amount": 2}, team, reviewer)
    assert sent == [run.pk] and Run.objects.get(pk=run.pk).status == "queued"


async def test_a_waiting_request_is_woken_by_the_engines_signal_from_another_thread() -> None:
    with waiting.changes_of(41) as changed, waiting.changes_of(42) as other:
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
