"""Runs and their steps: starting a run, running a step and recording how it ended (the queue,
actions.engine.queue, hands the steps over).

A step is run by the run's driver (actions.engine.driving.driver_for) under a lease: claimed
by one conditional UPDATE, recorded by another that only the holder of the current lease can
make. Everything slow (the step itself, pushes to browsers) happens after the transaction that
queued it commits.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from typing import Any, NamedTuple

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone
from pydantic import ValidationError

from actions import tracing
from actions.core import ApprovalPolicy, field_errors, registry
from actions.engine import decisions, rules, store
from actions.engine.driving import (
    NO_ANSWERS,
    Answers,
    Pause,
    StepResult,
    call_binding,
    driver_for,
    runs_an_action,
)
from actions.engine.errors import (
    DRIVER_STATE_LIMIT_FACTOR,
    MAX_ERROR_CHARS,
    InvalidInput,
    NotAllowed,
    check_size,
    retry_on_conflict,
    safe_text,
    storing_problem,
)
from actions.engine.journal import (
    atomic,
    inbox_changed,
    log,
    log_end,
    push_run_status,
    report_internal_error,
    step_ran,
)
from actions.engine.policies import policy_fields, policy_layers, why_not_start
from actions.engine.queue import (
    NO_LIMITS,
    StepRunner,
    answers_of,
    hand_on_turn,
    hand_over,
    inline,
    lease_from,
    note_waiting,
    shares,
    steps_run_by,
)
from actions.engine.sql import insert
from actions.models import Actor, ApiToken, Interrupt, Run, RunEvent, Team, actor_name, actor_user

logger = logging.getLogger(__name__)

Status = Run.Status


# The heartbeat. A lease is short (GRUNDLAG_STEP_LEASE_SECONDS), so that the sweeper finds a
# step whose worker died soon; a step that takes longer keeps its lease because its process,
# while it is alive, renews it every third of the lease, up to GRUNDLAG_MAX_STEP_SECONDS (a step
# stuck for good, say on a call without a timeout, then loses it and is re-queued, and after
# GRUNDLAG_MAX_STEP_REQUEUES fails its run). A process that dies stops renewing, and its steps'
# leases run out.
class _Held(NamedTuple):
    attempt: int
    began: float  # time.monotonic()
    # Its result is being recorded: the record itself says if the lease was lost meanwhile,
    # and once it commits the run is no longer running (the lease is then not renewed, and
    # not lost either).
    recording: bool = False


_held: dict[int, _Held] = {}  # run id -> the step running here
_held_lock = threading.Lock()
_heartbeat: threading.Thread | None = None


def _hold(run: Run) -> None:
    global _heartbeat
    with _held_lock:
        _held[run.pk] = _Held(run.attempt, time.monotonic())
        if _heartbeat is None or not _heartbeat.is_alive():
            _heartbeat = threading.Thread(target=_beat, name="grundlag-heartbeat", daemon=True)
            _heartbeat.start()


def _holding(run_id: int, attempt: int) -> _Held | None:
    """This attempt's step, if it still runs here. Under _held_lock."""
    held = _held.get(run_id)
    return held if held is not None and held.attempt == attempt else None


def _recording(run: Run) -> None:
    with _held_lock:
        if (held := _holding(run.pk, run.attempt)) is not None:
            _held[run.pk] = held._replace(recording=True)


def _let_go(run: Run) -> None:
    with _held_lock:
        if _holding(run.pk, run.attempt) is not None:
            del _held[run.pk]


def renew_leases() -> int:
    """Renew the lease of every step this process is running; how many were renewed. A lease
    taken over meanwhile (the sweeper re-queued the step) is left alone: the conditional
    record of this attempt will fail, and the new attempt's holder owns the run."""
    limit = time.monotonic() - settings.GRUNDLAG_MAX_STEP_SECONDS
    with _held_lock:
        held = {run_id: each.attempt for run_id, each in _held.items() if each.began > limit}
        overdue = [run_id for run_id, each in _held.items() if each.began <= limit]
    for run_id in overdue:
        logger.warning(
            "run %s: its step has run longer than GRUNDLAG_MAX_STEP_SECONDS; its lease is no longer renewed",
            run_id,
        )
    if not held:
        return 0
    # A transaction, so that on SQLite it takes its turn with the other writers (a write on its
    # own would wait in SQLite's busy handler, losing every race to them).
    with transaction.atomic():
        renewed = store.renew_leases(held, lease_from(timezone.now()))
    # A step that finished meanwhile was not renewed, and has lost nothing: only a step still
    # running here, its result not yet being recorded, can have had its lease taken. It is
    # told once, and not renewed again (the run is another attempt's now).
    with _held_lock:
        lost = [
            run_id
            for run_id, attempt in held.items()
            if run_id not in renewed
            and (each := _holding(run_id, attempt)) is not None
            and not each.recording
        ]
        for run_id in lost:
            del _held[run_id]
    for run_id in lost:
        logger.warning(
            "run %s: its step lost its lease (re-queued by the sweeper after a stall);"
            " its result will not be recorded",
            run_id,
        )
    return len(renewed)


def _beat() -> None:
    while True:
        time.sleep(max(settings.GRUNDLAG_STEP_LEASE_SECONDS / 3, 0.1))
        try:
            renew_leases()
        except Exception:
            logger.warning("could not renew step leases; trying again", exc_info=True)
        # This thread's connections, past CONN_MAX_AGE or broken. Whatever that raises must not
        # end the thread: the steps running here would stop being renewed, and the sweeper
        # would run them again while they still run.
        try:
            close_old_connections()
        except Exception:
            logger.debug("could not close the heartbeat's old database connections", exc_info=True)


# Starting


@retry_on_conflict
def start_run(
    action_name: str,
    input: Any,  # noqa: A002
    team: Team,
    by: Actor,
    consumer: str = Run.Consumer.API,
    driver_state: dict[str, Any] | None = None,
    *,
    here: bool = False,
) -> Run:
    """Validate the input and queue the run's first step. Raises UnknownAction, InvalidInput.
    ``here``: the first step runs in this process as soon as the run is committed, whatever
    GRUNDLAG_INLINE_STEPS says, for a driver whose step runs none of its caller's code and
    only records a pause (a service's question): its caller then finds the pause recorded."""
    if here and runs_an_action(consumer):
        raise ValueError("here: only for a driver whose step runs none of its caller's code")
    if why := why_not_start(by, team):
        raise NotAllowed(why)
    act = registry.get(action_name) if runs_an_action(consumer) else None
    check_size("the input", input)
    check_size(
        "the driver's state",
        driver_state or {},
        limit=settings.GRUNDLAG_MAX_PAYLOAD_BYTES * DRIVER_STATE_LIMIT_FACTOR,
    )
    if act is not None:
        try:
            input = act.input_model.model_validate(input).model_dump(mode="json")  # noqa: A001
        except ValidationError as exc:
            errors = field_errors(exc)
            raise InvalidInput("the input does not fit the action's input schema", errors) from None
    with atomic():
        run = Run(
            action=action_name,
            input=input,
            team=team,
            consumer=consumer,
            started_by=actor_user(by),
            started_by_name=actor_name(by),
            started_by_token=by if isinstance(by, ApiToken) else None,
            driver_state=driver_state or {},
        )
        if here or inline():
            run.status, run.attempt, run.lease_expires_at = Status.RUNNING, 1, lease_from(run.created_at)
        insert(run)
        log(run, RunEvent.Kind.STARTED, by, consumer=consumer)
        # Pushes are registered before the step is handed over, so browsers hear of this change
        # before any change the step makes (on_commit callbacks run in order). A run claimed
        # here is announced by the claim.
        if run.status == Status.QUEUED:
            push_run_status(run, run.status)
        hand_over(run, NO_ANSWERS)  # a new run has not paused
    return run


def pending_interrupts(run_id: int) -> list[Interrupt]:
    """The run's pending interrupts, in order: what a program that drives runs itself (with
    inline steps, the way LangGraph's invoke returns the interrupt) answers next."""
    return store.pending_interrupts(run_id)


# Executing a step (what a worker does)


@retry_on_conflict
def execute_step(run_id: int, queued_at: float | None = None) -> None:
    """Claim the run's queued step, run it, and record how it ended. Idempotent. ``queued_at``
    (epoch seconds) is when its message was sent, for the queue-wait figure."""
    now = timezone.now()
    limits = shares()
    with atomic():
        run = store.claim_queued(run_id, now, lease_from(now), limits)
        if run is None:
            # Another delivery of the message, or another worker, has it; or its team has its
            # share of the workers: it waits its turn, queued.
            if limits != NO_LIMITS:
                note_waiting(run_id)
            return
        log(run, RunEvent.Kind.CLAIMED, None, attempt=run.attempt)
        push_run_status(run, run.status)
    waited = max(0.0, time.time() - queued_at) if queued_at is not None else None
    _execute_claimed(run, queued_seconds=waited)


def _execute_claimed(run: Run, answers: Answers | None = None, queued_seconds: float | None = None) -> None:
    """Run the step of a run this process holds the lease of (renewed while it runs), and
    record how it ended."""
    _hold(run)
    began = time.perf_counter()
    try:
        with tracing.span("grundlag.step", lambda: _step_attributes(run)) as span:
            try:
                result = driver_for(run.consumer).step(
                    run, answers_of(run.pk) if answers is None else answers
                )
            except Exception as exc:
                logger.exception("step of run %s crashed in the engine", run.pk)
                result = StepResult(Status.FAILED, error=f"{type(exc).__name__}: {exc}", internal=True)
            seconds = time.perf_counter() - began
            span.set_attribute("grundlag.run.status", result.status)
            _recording(run)
            record(run, result)
    finally:
        _let_go(run)
        # The runs whose turn this gives are others' work: not in this step's trace.
        with tracing.detached():
            hand_on_turn(run.team_id)
    step_ran.send(
        Run, action=run.action, status=result.status, seconds=seconds, queued_seconds=queued_seconds
    )


def _result_problem(result: StepResult) -> str:
    if result.status == Status.COMPLETED:
        return storing_problem("the output", result.output)
    for pause in result.pauses:
        if problem := (
            storing_problem("the interrupt's data", pause.data)
            or storing_problem("the checkpoint", pause.state)
            or storing_problem("the call's arguments", pause.arguments)
        ):
            return problem
    return ""


def _checked(run: Run, result: StepResult) -> StepResult:
    """The result as it can be stored. What is stored is shown on pages, in exports and in the
    admin: a value too deep (or not JSON) is refused here, for every driver, and the run fails
    saying which. Text from an action or a script (an error, a pause's message) is whatever it
    raised: bounded, and escaped where a database could not store it. A driver's state that
    cannot be stored is not (the run keeps the one it had); otherwise it is kept even when the
    step fails here, so the transcript shows what led to the failure."""
    if result.status == Status.INTERRUPTED and not result.pauses:
        # Nothing to answer would leave the run waiting forever: a driver's defect, said so.
        logger.error("run %s: a step reported interrupted with no pause", run.pk)
        result = dataclasses.replace(
            result,
            status=Status.FAILED,
            error="the step paused without saying on what (an engine defect)",
            internal=False,
        )
    error = report_internal_error(run.pk, result.error) if result.internal else result.error
    result = dataclasses.replace(
        result,
        error=safe_text(error, MAX_ERROR_CHARS),
        internal=False,
        pauses=[
            dataclasses.replace(pause, message=safe_text(pause.message, MAX_ERROR_CHARS))
            for pause in result.pauses
        ],
    )
    state_problem = ""
    if result.driver_state is not None:
        state_problem = storing_problem("the driver's state", result.driver_state, DRIVER_STATE_LIMIT_FACTOR)
    if problem := state_problem or _result_problem(result):
        logger.warning("run %s: %s", run.pk, problem)
        result = StepResult(
            Status.FAILED,
            error=f"the step's result cannot be stored: {problem}",
            driver_state=None if state_problem else result.driver_state,
        )
    return result


def record(run: Run, result: StepResult) -> None:
    """Record how a step ended, with the driver's new state and the interrupts it paused on."""
    result = _checked(run, result)  # once, outside the retries: an internal error is reported once
    pauses = _judged(run, result)  # before the transaction: no condition runs under its lock
    _record(run, result, store.KEEP if result.driver_state is None else result.driver_state, pauses)


@dataclasses.dataclass(frozen=True)
class _Judged:
    """A pause, the policy it is decided under, its team's rules and grants (as read before the
    transaction, as they would be read in it: neither is locked), and what their conditions say."""

    pause: Pause
    action: str
    policy: ApprovalPolicy
    layers: list[dict[str, Any]]  # what the action, the team's policy and the request set
    teams: rules.TeamSet
    said: rules.Judged


def _judged(run: Run, result: StepResult) -> list[_Judged]:
    """Each of the step's pauses, with what the rules' and grants' conditions say of it,
    evaluated with one budget for the step."""
    judged: list[_Judged] = []
    if result.status != Status.INTERRUPTED:
        return judged
    spent = 0
    for pause in result.pauses:
        action_name = pause.action or run.action
        override, version, slug = store.team_policy(run.team_id, action_name)
        policy, layers = policy_layers(action_name, override, pause.policy)
        teams = rules.team_set(run.team_id, (version, slug))
        said = rules.judge(run, action_name, pause.data, pause.arguments, policy, teams, spent)
        spent = said.given.spent if said.given is not None else spent
        judged.append(_Judged(pause, action_name, policy, layers, teams, said))
    return judged


@retry_on_conflict
def _record(
    run: Run, result: StepResult, driver_state: dict[str, Any] | store.Keep, pauses: list[_Judged]
) -> None:
    now = timezone.now()
    with atomic():
        finished = result.status in Run.FINISHED
        recorded = store.record_step(
            run,
            now,
            status=result.status,
            driver_state=driver_state,
            output=result.output if result.status == Status.COMPLETED else None,
            error=result.error if result.status == Status.FAILED else "",
            finished_at=now if finished else None,
        )
        if not recorded:
            logger.warning("run %s attempt %s lost its lease; result dropped", run.pk, run.attempt)
            return
        created = []
        if result.status == Status.INTERRUPTED:
            for each in pauses:
                pause, action_name, policy = each.pause, each.action, each.policy
                # The team's rules, the action's, and delegations: before anyone sees it.
                # The pause's own answer schema goes with its fields: a rule's answer must fit it.
                fields = policy_fields(run.team_id, action_name, now, policy) | {
                    "answer_schema": pause.answer_schema
                }
                routed = rules.route(run, action_name, fields, policy, each.teams, each.said)
                interrupt = Interrupt(
                    run_id=run.pk,
                    action=action_name,
                    message=pause.message,
                    data=pause.data,
                    state=pause.state,
                    tool_call_id=pause.tool_call_id,
                    binding=pause.binding or call_binding(action_name),
                    arguments=pause.arguments,
                    **{"team_id": run.team_id, **routed.fields},
                )
                with tracing.span(
                    "grundlag.pause", functools.partial(_pause_attributes, run, interrupt)
                ) as span:
                    # Its decision and notifications continue this trace, however much later.
                    interrupt.traceparent = tracing.traceparent() or None
                    insert(interrupt, store.next_seq(run.pk))
                    span.set_attribute("grundlag.interrupt.id", interrupt.pk)
                log(
                    run,
                    RunEvent.Kind.INTERRUPTED,
                    None,
                    interrupt,
                    seq=interrupt.seq,
                    **rules.event_detail(routed, each.layers),
                )
                inbox_changed("interrupt", interrupt, before=(), after=[interrupt.team_id])
                created.append((interrupt, routed, policy))
        elif result.status == Status.COMPLETED:
            log_end(run, result.status, output=result.output)
        else:
            log_end(run, result.status, error=result.error)
        push_run_status(run, result.status)
        # Decided by a rule or a grant once all of the step's pauses are in (the run goes on
        # only when none is left pending), and after the pause's own status is pushed: pages
        # see "interrupted", then what the decision made of the run.
        for interrupt, routed, policy in created:
            decisions.settle(run, interrupt, routed, policy)


def _step_attributes(run: Run) -> dict[str, Any]:
    return {"grundlag.run.id": run.pk, "grundlag.action": run.action, "grundlag.attempt": run.attempt}


def _pause_attributes(run: Run, interrupt: Interrupt) -> dict[str, Any]:
    return {
        "grundlag.run.id": run.pk,
        "grundlag.action": interrupt.action,
        "grundlag.team.id": interrupt.team_id,
        # The GenAI conventions' names, for an agent's tool call.
        "gen_ai.tool.name": interrupt.action if interrupt.tool_call_id else None,
        "gen_ai.tool.call.id": interrupt.tool_call_id or None,
    }


# The queue hands steps over to this module's runner (the engine's package loads it).
steps_run_by(StepRunner(queued=execute_step, claimed=_execute_claimed))
