"""Fair share of the step workers (issue 35): a team, an API token or a team's scripts at their
share of running steps make their next run wait its turn, queued and not lost, while another
team's run goes on; the waiting run goes on as soon as one of its team's steps ends."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections
from django.utils import timezone
from pydantic import BaseModel

from actions import engine
from actions.core import ActionContext, ActionInterrupt, action
from actions.engine import queue, steps
from actions.models import ApiToken, Run, Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database")]

release = threading.Event()
entered = threading.Event()


class Job(BaseModel):
    slow: bool = False


def job(ctx: ActionContext) -> dict[str, Any]:
    if ctx.input.slow:
        entered.set()
        assert release.wait(30), "the test never released the slow step"
        return {"done": True}
    if ctx.resumption is None:
        raise ActionInterrupt("Go on?", {})
    return {"done": True}


action(input=Job, name="fair_share_job")(job)


@pytest.fixture(autouse=True)
def _workers(settings: Any) -> Any:
    """Steps go to a worker (here Celery, eager: the step runs in the thread that queues it)."""
    settings.GRUNDLAG_INLINE_STEPS = False
    settings.GRUNDLAG_TEAM_STEPS = 1
    settings.GRUNDLAG_TOKEN_STEPS = 0
    settings.GRUNDLAG_TEAM_SCRIPTS = 0
    release.clear()
    entered.clear()
    yield
    release.set()


def status(run: Run) -> str:
    return str(Run.objects.values_list("status", flat=True).get(pk=run.pk))


def in_flight(team: Team, **fields: Any) -> Run:
    """A step of ``team`` running elsewhere (another worker's, its lease live)."""
    defaults = {"action": "fair_share_job", "input": {}, "status": Run.Status.RUNNING, "attempt": 1}
    return Run.objects.create(
        team=team, lease_expires_at=timezone.now() + timedelta(minutes=5), **{**defaults, **fields}
    )


@pytest.mark.django_db(transaction=True)  # steps claimed on other threads
def test_a_team_at_its_share_waits_its_turn_while_another_team_goes_on(team: Team, other_team: Team) -> None:
    slow: list[Run] = []

    def start_slow() -> None:
        try:
            slow.append(engine.start_run("fair_share_job", {"slow": True}, team, None))
        finally:
            close_old_connections()

    worker = threading.Thread(target=start_slow)
    worker.start()
    assert entered.wait(10)  # the team's one place is taken by a step that is running
    waiting = engine.start_run("fair_share_job", {}, team, None)
    assert status(waiting) == Run.Status.QUEUED  # not claimed, not lost
    other = engine.start_run("fair_share_job", {}, other_team, None)
    assert status(other) == Run.Status.INTERRUPTED  # another team is not held up
    release.set()
    worker.join(20)
    assert status(slow[0]) == Run.Status.COMPLETED
    # The slow step's end handed the team's turn on: the waiting run ran, in that worker.
    assert status(waiting) == Run.Status.INTERRUPTED


def test_the_sweeper_hands_a_waiting_run_on_if_no_step_of_its_team_ends(team: Team, settings: Any) -> None:
    running = in_flight(team)
    waiting = engine.start_run("fair_share_job", {}, team, None)
    assert status(waiting) == Run.Status.QUEUED
    Run.objects.filter(pk=running.pk).update(status=Run.Status.COMPLETED, lease_expires_at=None)
    settings.GRUNDLAG_QUEUED_GRACE_SECONDS = 0
    engine.sweep()
    assert status(waiting) == Run.Status.INTERRUPTED


def test_a_token_and_a_teams_scripts_have_shares_of_their_own(team: Team, settings: Any) -> None:
    settings.GRUNDLAG_TEAM_STEPS = 0
    settings.GRUNDLAG_TOKEN_STEPS = 1
    settings.GRUNDLAG_TEAM_SCRIPTS = 1
    token, _ = ApiToken.issue(team, "flood")
    in_flight(team, started_by_token=token)
    by_token = engine.start_run("fair_share_job", {}, team, token)
    assert status(by_token) == Run.Status.QUEUED
    by_person = engine.start_run("fair_share_job", {}, team, None)
    assert status(by_person) == Run.Status.INTERRUPTED  # the team itself has no limit here
    in_flight(team, consumer=Run.Consumer.SANDBOX)
    script = Run.objects.create(team=team, action="fair_share_job", input={}, consumer=Run.Consumer.SANDBOX)
    steps.execute_step(script.pk)
    assert status(script) == Run.Status.QUEUED  # a second script of the team waits
    settings.GRUNDLAG_TEAM_SCRIPTS = 0
    settings.GRUNDLAG_TOKEN_STEPS = 0
    steps.execute_step(by_token.pk)
    assert status(by_token) == Run.Status.INTERRUPTED


def test_a_waiting_script_is_passed_over_for_a_run_that_may_go_and_the_sweeper_sends_neither_in_vain(
    team: Team, settings: Any
) -> None:
    from actions.engine import store

    settings.GRUNDLAG_TEAM_STEPS = 0
    settings.GRUNDLAG_TEAM_SCRIPTS = 1
    in_flight(team, consumer=Run.Consumer.SANDBOX)
    script = Run.objects.create(team=team, action="fair_share_job", input={}, consumer=Run.Consumer.SANDBOX)
    plain = Run.objects.create(team=team, action="fair_share_job", input={})
    Run.objects.filter(pk=script.pk).update(updated_at=timezone.now() - timedelta(minutes=1))
    # The script waits longest, but cannot go: the plain run is handed on.
    assert store.next_in_line(team.pk, 1, queue.shares()) == [plain.pk]
    assert store.unclaimed(timezone.now(), queue.shares()) == [plain.pk]
