"""The run queue: handing a run's next step over once the transaction that queued it commits
(to a Celery worker, this process's embedded pool, or, with inline steps, this thread), the
leases steps run under, the teams' fair shares, and the decisions a step resumes from.

What runs a step is actions.engine.steps, which registers itself here as it loads
(``steps_run_by``): the decisions hand runs over through this module, and steps, whose pauses
a rule may decide at once, sits above the decisions."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from actions import background
from actions.engine import store
from actions.engine.driving import Answer, Answers
from actions.engine.journal import log, push_run_status
from actions.models import Interrupt, Run, RunEvent

logger = logging.getLogger(__name__)

Status = Run.Status


@dataclass(frozen=True)
class StepRunner:
    """How this process runs a step: ``queued``, claiming a queued run first; ``claimed``, one
    whose lease the caller's transaction took (with the answers it resumes from, if known)."""

    queued: Callable[[int], None]
    claimed: Callable[[Run, Answers | None], None]


_runner: StepRunner | None = None


def steps_run_by(runner: StepRunner) -> None:
    global _runner
    _runner = runner


def _executor() -> StepRunner:
    if _runner is None:
        raise RuntimeError("actions.engine.steps is not loaded: import actions.engine")
    return _runner


def inline() -> bool:
    """Whether steps run in the process that queues them (GRUNDLAG_INLINE_STEPS), not in workers."""
    return bool(settings.GRUNDLAG_INLINE_STEPS)


def lease_from(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.GRUNDLAG_STEP_LEASE_SECONDS)


# The embedded setup (`manage.py serve` with no broker) is its own worker: a step goes to one
# of this process's threads as the transaction that queued it commits, with no broker to poll
# (actions.background.threads_for). It runs the same task, and makes the same claim, as a Celery
# worker would.
def run_steps_in(pool: Executor | None) -> None:
    """Run queued steps in ``pool``'s threads (None: hand them to Celery). Once the pool is shut
    down, a step queued meanwhile stays queued in the database, for the next start to run."""
    background.threads_for(background.queue_of(background.RUN_STEP), pool)


def runs_here() -> bool:
    """Whether this process runs the steps it queues (inline, or in its embedded pool)."""
    return inline() or background.runs_in_threads(background.RUN_STEP)


def enqueue(run_id: int) -> None:
    """Once the transaction that queued the run commits, hand its next step to a worker (or,
    with inline steps, run it here; it is claimed like a worker would)."""
    if inline():
        _step_after_commit(run_id, lambda: _executor().queued(run_id))
        return

    def submit() -> None:
        try:
            background.submit(background.RUN_STEP, run_id, headers={background.QUEUED_AT: str(time.time())})
        except RuntimeError:  # the embedded pool is stopping: the next start runs it
            logger.warning("run %s stays queued: the process is stopping", run_id)
        except Exception:
            # The run is committed as queued; the sweeper enqueues it again. Nothing is lost.
            logger.exception("could not enqueue run %s; the sweeper will retry", run_id)

    transaction.on_commit(submit, robust=True)


def hand_over(run: Run, answers: Answers | None = None) -> None:
    """The run's next step runs once this transaction commits: in a worker, which claims the
    queued run; or, with inline steps, here, the run claimed already by this transaction (so
    the claim costs no transaction of its own, and means the same: one holder, one lease).
    ``answers`` are what the step resumes from, when the caller knows them."""
    if run.status != Status.RUNNING:
        enqueue(run.pk)
        return
    log(run, RunEvent.Kind.CLAIMED, None, attempt=run.attempt)
    push_run_status(run, run.status)
    _step_after_commit(run.pk, lambda: _executor().claimed(run, answers))


def _step_after_commit(run_id: int, step: Callable[[], None]) -> None:
    """Run an inline step once this transaction commits."""

    def run_step() -> None:
        try:
            step()
        except Exception:
            # Our caller's change is committed and the run is queued or holds a lease: the
            # sweeper hands the step on. The caller is not told of a failure it did not cause.
            logger.exception("step of run %s failed to record; the sweeper will retry it", run_id)

    transaction.on_commit(run_step)


def answer_of(interrupt: Interrupt) -> Answer:
    return Answer(
        approved=interrupt.status == Interrupt.Status.APPROVED,
        data=interrupt.answer,
        state=interrupt.state,
        reason=interrupt.reason,
        decided_by=interrupt.decided_by_name,
        arguments=interrupt.edited_arguments,
    )


def answers_of(run_id: int, *, latest: Interrupt | None = None) -> Answers:
    """The run's decisions, read when a driver first asks for one that is not ``latest`` (the
    interrupt whose decision has just resumed the run: the latest for its call)."""
    return Answers(
        lambda: [(it.binding, answer_of(it)) for it in store.decided_interrupts(run_id)],
        latest=(latest.binding, answer_of(latest)) if latest is not None else None,
    )


# Fair share: a team (an API token, a team's scripts) has at most so many steps running at once,
# so that one team's slow steps or scripts cannot hold every worker while another's wait. The
# claim counts them (store.claim_queued); a run over the share stays queued, and is handed on
# when one of its team's steps ends (or, at the latest, by the sweeper's next pass).
NO_LIMITS = store.Shares()


def shares() -> store.Shares:
    return store.Shares(
        settings.GRUNDLAG_TEAM_STEPS, settings.GRUNDLAG_TOKEN_STEPS, settings.GRUNDLAG_TEAM_SCRIPTS
    )


def _waiting_key(team_id: int) -> str:
    return f"grundlag:waiting-turn:{team_id}"


def note_waiting(run_id: int) -> None:
    """If the run the claim refused is still queued, it waits for its turn: say so (in the cache
    every worker shares) for its team."""
    team_id = Run.objects.filter(pk=run_id, status=Status.QUEUED).values_list("team_id", flat=True).first()
    if team_id is not None:
        cache.set(_waiting_key(team_id), True, timeout=settings.GRUNDLAG_QUEUED_GRACE_SECONDS * 6)
        logger.info("run %s waits its turn: its team has its share of the workers", run_id)


def hand_on_turn(team_id: int) -> None:
    """One of the team's steps ended: where runs of the team wait their turn, the longest
    waiting go to the workers now (a claim still decides which may run)."""
    if inline() or not cache.get(_waiting_key(team_id)):
        return
    waiting = store.next_in_line(team_id, 2, shares())
    if not waiting:
        cache.delete(_waiting_key(team_id))
    for run_id in waiting:
        enqueue(run_id)
