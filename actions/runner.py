"""Every state change of a run or an interrupt.

Views, the API, consumers, tasks and management commands call these functions; none of them
changes a status itself. Each change is one conditional UPDATE (or a row lock followed by one),
so concurrent callers get exactly one winner, and slow work (running a step, pushing to
browsers) happens after commit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone
from pydantic import ValidationError

from actions import live
from actions.core import (
    Action,
    ActionResumption,
    Completed,
    Failed,
    Interrupted,
    field_errors,
    invoke,
    registry,
)
from actions.models import Actor, Interrupt, Run, RunEvent, Team, actor_name, actor_user

logger = logging.getLogger(__name__)

Status = Run.Status

# A queued step older than this is presumed to have lost its message and is sent again.
QUEUED_GRACE_SECONDS = 60


class EngineError(Exception):
    """A refused request. The message is safe to show to whoever made it."""


class InvalidInput(EngineError):
    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.errors = errors


class InvalidAnswer(InvalidInput):
    pass


class PayloadTooLarge(EngineError):
    pass


class AlreadyDecided(EngineError):
    def __init__(self, interrupt: Interrupt) -> None:
        self.interrupt = interrupt
        if interrupt.decided_at is not None:
            when = timezone.localtime(interrupt.decided_at).strftime("%Y-%m-%d %H:%M:%S %Z")
            text = f"already {interrupt.status} by {interrupt.decided_by_name} at {when}"
        else:
            text = f"this interrupt is {interrupt.status} and can no longer be decided"
        super().__init__(text)


class NotCancellable(EngineError):
    pass


MAX_NESTING = 32


def _depth(value: Any) -> int:
    """How deeply ``value`` nests, counted without recursion (an attacker chooses the depth)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, (list, tuple)):
            deepest = max(deepest, depth)
            if depth > MAX_NESTING:
                break
            stack.extend((child, depth + 1) for child in item)
    return deepest


def check_size(what: str, value: Any) -> None:
    """Refuse a payload that is too large or too deeply nested to store and render safely."""
    if _depth(value) > MAX_NESTING:
        raise InvalidInput(
            f"{what} nests deeper than {MAX_NESTING} levels",
            [{"loc": [], "msg": f"nested deeper than {MAX_NESTING} levels", "type": "too_deep"}],
        )
    limit = settings.GRUNDLAG_MAX_PAYLOAD_BYTES
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes; the limit is {limit} bytes")


def _log(
    run: Run | int,
    kind: str,
    by: Actor = None,
    interrupt: Interrupt | None = None,
    **detail: Any,
) -> None:
    run_id = run if isinstance(run, int) else run.pk
    RunEvent.objects.create(
        run_id=run_id,
        interrupt=interrupt,
        kind=kind,
        actor=actor_user(by),
        actor_name=actor_name(by),
        detail=detail,
    )


def _enqueue(run_id: int) -> None:
    """Hand the run's next step to a worker once the transaction that queued it commits."""

    def send() -> None:
        from actions.tasks import run_step

        try:
            run_step.delay(run_id)
        except Exception:
            # The run is committed as queued; the sweeper enqueues it again. Nothing is lost.
            logger.exception("could not enqueue run %s; the sweeper will retry", run_id)

    transaction.on_commit(send)


def _push_after_commit(team_id: int, event: str, **payload: Any) -> None:
    transaction.on_commit(lambda: live.notify_team(team_id, event, **payload))


# Starting


def start_run(
    action_name: str,
    input: Any,  # noqa: A002
    team: Team,
    by: Actor,
    consumer: str = Run.Consumer.API,
    driver_state: dict[str, Any] | None = None,
) -> Run:
    """Validate the input and queue the run's first step. Raises UnknownAction, InvalidInput."""
    act = registry.get(action_name) if consumer not in DRIVERS else None
    check_size("the input", input)
    if act is not None:
        try:
            input = act.input_model.model_validate(input).model_dump(mode="json")  # noqa: A001
        except ValidationError as exc:
            errors = field_errors(exc)
            raise InvalidInput("the input does not fit the action's input schema", errors) from None
    with transaction.atomic():
        run = Run.objects.create(
            action=action_name,
            input=input,
            team=team,
            consumer=consumer,
            started_by=actor_user(by),
            started_by_name=actor_name(by),
            driver_state=driver_state or {},
        )
        _log(run, RunEvent.Kind.STARTED, by, consumer=consumer)
        # Pushes are registered before the enqueue, so browsers hear of this change before
        # any change the step makes (on_commit callbacks run in order).
        _push_after_commit(team.pk, "run", run_id=run.pk, status=run.status)
        _enqueue(run.pk)
    return run


# Deciding


def _answer_model_action(interrupt: Interrupt) -> Action | None:
    return registry.get(interrupt.action) if interrupt.action in registry else None


def validate_answer(interrupt: Interrupt, data: Any) -> Any:
    """The answer as it will be stored, or InvalidAnswer with field errors."""
    check_size("the answer", data)
    act = _answer_model_action(interrupt)
    if act is None:
        return data
    try:
        return act.validate_answer(data)
    except ValidationError as exc:
        raise InvalidAnswer("the answer does not fit the action's answer schema", field_errors(exc)) from None


def _decide(
    interrupt_id: int,
    status: str,
    by: Actor,
    *,
    answer: Any = None,
    reason: str = "",
    then: Callable[[Run, Interrupt], None],
) -> Interrupt:
    now = timezone.now()
    with transaction.atomic():
        # Lock the run first: two reviewers deciding two interrupts of one agent turn must see
        # each other's decision, or neither would resume the run (PostgreSQL; SQLite's IMMEDIATE
        # transactions already serialise writers).
        run_id = Interrupt.objects.values_list("run_id", flat=True).get(pk=interrupt_id)
        run = Run.objects.select_for_update().get(pk=run_id)
        # The conditional UPDATE is the decision: of two reviewers clicking at once, exactly one
        # changes a pending row; the other changes nothing and is told who won.
        won = Interrupt.objects.filter(pk=interrupt_id, status=Interrupt.Status.PENDING).update(
            status=status,
            answer=answer,
            reason=reason,
            decided_by=actor_user(by),
            decided_by_name=actor_name(by),
            decided_at=now,
        )
        interrupt = Interrupt.objects.get(pk=interrupt_id)
        if not won:
            raise AlreadyDecided(interrupt)
        if status == Interrupt.Status.APPROVED:
            _log(run, RunEvent.Kind.APPROVED, by, interrupt, seq=interrupt.seq)
        else:
            _log(run, RunEvent.Kind.REJECTED, by, interrupt, seq=interrupt.seq, reason=reason)
        _push_after_commit(
            run.team_id,
            "decided",
            run_id=run.pk,
            interrupt_id=interrupt.pk,
            status=interrupt.status,
            decided_by=interrupt.decided_by_name,
        )
        then(run, interrupt)
    return interrupt


def _queue_if_nothing_pending(run: Run, interrupt: Interrupt) -> None:
    # An agent turn may pause on several tool calls; the run goes on when the last is decided.
    if run.interrupts.filter(status=Interrupt.Status.PENDING).exists():
        return
    queued = Run.objects.filter(pk=run.pk, status=Status.INTERRUPTED).update(
        status=Status.QUEUED, updated_at=timezone.now()
    )
    if queued:
        _log(run, RunEvent.Kind.RESUMED, None, interrupt, seq=interrupt.seq)
        _enqueue(run.pk)


def resume(interrupt: Interrupt, data: Any, by: Actor) -> Interrupt:
    """Approve ``interrupt`` with ``data`` as the answer and queue the run to go on.

    Raises InvalidAnswer (nothing changed) or AlreadyDecided (someone else was first).
    """
    answer = validate_answer(interrupt, data)
    return _decide(interrupt.pk, Interrupt.Status.APPROVED, by, answer=answer, then=_queue_if_nothing_pending)


def reject(interrupt: Interrupt, reason: str, by: Actor) -> Interrupt:
    """Reject ``interrupt``. An action's run ends ``rejected``; an agent sees the reason as the
    tool's result and goes on."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required to reject", [{"loc": ["error"], "msg": "required"}])
    check_size("the reason", reason)

    def end_or_go_on(run: Run, decided: Interrupt) -> None:
        driver = DRIVERS.get(run.consumer)
        if driver is not None and driver.rejection_continues:
            _queue_if_nothing_pending(run, decided)
            return
        _finish_with_pending_cancelled(run, Status.REJECTED, error=reason)

    return _decide(interrupt.pk, Interrupt.Status.REJECTED, by, reason=reason, then=end_or_go_on)


def _finish_with_pending_cancelled(run: Run, status: str, *, error: str = "", by: Actor = None) -> None:
    now = timezone.now()
    run.interrupts.filter(status=Interrupt.Status.PENDING).update(
        status=Interrupt.Status.CANCELLED,
        decided_at=now,
        decided_by=actor_user(by),
        decided_by_name=actor_name(by),
    )
    Run.objects.filter(pk=run.pk).update(
        status=status, error=error, finished_at=now, updated_at=now, lease_expires_at=None
    )


def cancel(run: Run, by: Actor) -> None:
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.is_finished:
            raise NotCancellable(f"run {run.pk} is already {locked.status}")
        _finish_with_pending_cancelled(locked, Status.CANCELLED, by=by)
        _log(locked, RunEvent.Kind.CANCELLED, by)
        _push_after_commit(locked.team_id, "run", run_id=locked.pk, status=Status.CANCELLED)


# Executing a step (what a worker does)


@dataclass(frozen=True)
class Pause:
    message: str
    data: Any
    state: Any
    tool_call_id: str = ""
    action: str = ""


@dataclass
class StepResult:
    """How a step ended, as a driver reports it: output, error, or one or more pauses."""

    status: str
    output: Any = None
    error: str = ""
    pauses: list[Pause] = field(default_factory=list)


class Driver:
    """Runs one step of a run for one consumer. Actions have the plain driver below; agents
    and sandboxes register their own (actions.agent, actions.sandbox)."""

    rejection_continues = False

    def step(self, run: Run) -> StepResult:
        raise NotImplementedError


DRIVERS: dict[str, Driver] = {}


def last_resumption(run: Run) -> ActionResumption | None:
    """The answer and checkpoint of the run's latest interrupt, if it was approved."""
    last = run.interrupts.order_by("-seq").first()
    if last is None or last.status != Interrupt.Status.APPROVED:
        return None
    return ActionResumption(data=last.answer, state=last.state)


def step_action(action_name: str, input: Any, resumption: ActionResumption | None, run_id: int) -> StepResult:  # noqa: A002
    outcome = invoke(action_name, input, resumption, run_id=run_id)
    if isinstance(outcome, Completed):
        return StepResult(Status.COMPLETED, output=outcome.output)
    if isinstance(outcome, Interrupted):
        pause = Pause(outcome.message, outcome.data, outcome.state, action=action_name)
        return StepResult(Status.INTERRUPTED, pauses=[pause])
    assert isinstance(outcome, Failed)
    return StepResult(Status.FAILED, error=outcome.error)


def execute_step(run_id: int) -> None:
    """Claim the run's queued step, run it, and record how it ended. Idempotent."""
    now = timezone.now()
    lease = timedelta(seconds=settings.GRUNDLAG_STEP_LEASE_SECONDS)
    # The claim: of two deliveries of the same message (at-least-once), or two workers, exactly
    # one moves the run from queued to running; the other returns without running anything.
    claimed = Run.objects.filter(pk=run_id, status=Status.QUEUED).update(
        status=Status.RUNNING,
        attempt=F("attempt") + 1,
        lease_expires_at=now + lease,
        updated_at=now,
    )
    if not claimed:
        return
    run = Run.objects.get(pk=run_id)
    _log(run, RunEvent.Kind.CLAIMED, None, attempt=run.attempt)
    live.notify_team(run.team_id, "run", run_id=run.pk, status=run.status)

    driver = DRIVERS.get(run.consumer)
    try:
        if driver is not None:
            result = driver.step(run)
        else:
            result = step_action(run.action, run.input, last_resumption(run), run.pk)
    except Exception as exc:
        logger.exception("step of run %s crashed in the engine", run_id)
        result = StepResult(Status.FAILED, error=f"internal error: {type(exc).__name__}: {exc}")
    record(run, result)


def record(run: Run, result: StepResult) -> None:
    now = timezone.now()
    with transaction.atomic():
        # Only the holder of the current lease may record: if the sweeper re-queued this run
        # (we were presumed dead) and another worker claimed it, our late result is dropped.
        changes: dict[str, Any] = {
            "status": result.status,
            "updated_at": now,
            "lease_expires_at": None,
            "driver_state": run.driver_state,
        }
        if result.status == Status.COMPLETED:
            changes.update(output=result.output, finished_at=now, error="")
        elif result.status == Status.FAILED:
            changes.update(error=result.error, finished_at=now)
        recorded = Run.objects.filter(pk=run.pk, status=Status.RUNNING, attempt=run.attempt).update(**changes)
        if not recorded:
            logger.warning("run %s attempt %s lost its lease; result dropped", run.pk, run.attempt)
            return
        if result.status == Status.INTERRUPTED:
            last = run.interrupts.aggregate(last=Max("seq"))["last"] or 0
            for offset, pause in enumerate(result.pauses, start=1):
                interrupt = Interrupt.objects.create(
                    run=run,
                    seq=last + offset,
                    team_id=run.team_id,
                    action=pause.action or run.action,
                    message=pause.message,
                    data=pause.data,
                    state=pause.state,
                    tool_call_id=pause.tool_call_id,
                )
                _log(run, RunEvent.Kind.INTERRUPTED, None, interrupt, seq=interrupt.seq)
                _push_after_commit(
                    run.team_id, "interrupt", run_id=run.pk, interrupt_id=interrupt.pk, status="pending"
                )
        elif result.status == Status.COMPLETED:
            _log(run, RunEvent.Kind.COMPLETED, None)
        else:
            _log(run, RunEvent.Kind.FAILED, None, error=result.error)
        _push_after_commit(run.team_id, "run", run_id=run.pk, status=result.status)


# Recovering


def sweep(*, all_unfinished: bool = False) -> int:
    """Re-queue steps whose worker died and re-send queued steps whose message was lost.

    Safe to run anywhere, any number of times: a duplicate message finds nothing to claim.
    ``all_unfinished`` treats every running step as dead; only a process that knows it is the
    sole worker (the embedded setup, at start) may say so.
    """
    now = timezone.now()
    count = 0
    running = Run.objects.filter(status=Status.RUNNING)
    if not all_unfinished:
        running = running.filter(lease_expires_at__lt=now)
    for run_id, attempt in running.values_list("pk", "attempt"):
        with transaction.atomic():
            # Conditional on the attempt: a worker that reports back meanwhile keeps its result.
            requeued = Run.objects.filter(pk=run_id, status=Status.RUNNING, attempt=attempt).update(
                status=Status.QUEUED, updated_at=now, lease_expires_at=None
            )
            if requeued:
                _log(run_id, RunEvent.Kind.REQUEUED, None, reason="lease expired", attempt=attempt)
                _enqueue(run_id)
                count += 1
    grace = now if all_unfinished else now - timedelta(seconds=QUEUED_GRACE_SECONDS)
    for run_id in Run.objects.filter(status=Status.QUEUED, updated_at__lte=grace).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            if Run.objects.filter(pk=run_id, status=Status.QUEUED, updated_at__lte=grace).update(
                updated_at=now
            ):
                _enqueue(run_id)
                count += 1
    return count
