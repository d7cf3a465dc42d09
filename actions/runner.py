"""Every state change of a run or an interrupt.

Views, the API, consumers, tasks and management commands call these functions; none of them
changes a status itself. Each change is one conditional UPDATE (or a row lock followed by one),
so concurrent callers get exactly one winner, and slow work (running a step, pushing to
browsers) happens after commit. The statements every run goes through are written in SQL
(see actions.store for why); the rarer ones use the ORM.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, transaction
from django.utils import timezone
from pydantic import ValidationError

from actions import live, store
from actions.core import (
    MAX_NESTING,
    ActionResumption,
    ApprovalPolicy,
    Completed,
    Failed,
    Interrupted,
    describe_errors,
    field_errors,
    invoke,
    registry,
    value_problem,
)
from actions.models import (
    Actor,
    ApiToken,
    Approval,
    Interrupt,
    Policy,
    Run,
    RunEvent,
    Team,
    actor_name,
    actor_user,
)

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


class NotAllowed(EngineError):
    """The caller may see this interrupt but not decide it (assignment, N-of-M rules,
    separation of duties)."""


class Busy(EngineError):
    """A change lost to concurrent changes more often than it is retried. Nothing changed."""


# Transient conflicts a transaction may lose to another (PostgreSQL's deadlock_detected and
# serialization_failure): the loser is rolled back whole, so running it again is safe.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
RETRIES = 5

P = ParamSpec("P")
R = TypeVar("R")


def _is_conflict(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_on_conflict(change: Callable[P, R]) -> Callable[P, R]:
    """Run an engine change again when the database rolled it back for a deadlock or a
    serialization failure. Only the outermost transaction can be retried: inside a caller's
    own ``atomic()`` block the conflict goes up to it."""

    @wraps(change)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(1, RETRIES + 1):
            try:
                return change(*args, **kwargs)
            except OperationalError as exc:
                if not _is_conflict(exc) or connection.in_atomic_block:
                    raise
                logger.info("%s lost a conflict (attempt %s): %s", change.__name__, attempt, exc)
                time.sleep(random.uniform(0, 0.02 * attempt))
        raise Busy("the change met concurrent changes too often; nothing was changed, try again")

    return retrying


MAX_ERROR_CHARS = 4000
# A driver's state (an agent's conversation, a script's call log) grows with the run: its limit
# is this many times GRUNDLAG_MAX_PAYLOAD_BYTES.
DRIVER_STATE_LIMIT_FACTOR = 16


def safe_text(text: str, limit: int | None = None) -> str:
    """Text any database stores: lone surrogates escaped, and at most ``limit`` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def check_size(what: str, value: Any, *, limit: int | None = None) -> None:
    """Refuse a value that cannot be stored and shown safely: nested deeper than MAX_NESTING
    (pages, exports and the admin render it), a number JSON has no word for (NaN, Infinity:
    the database's JSON check refuses them), or larger than GRUNDLAG_MAX_PAYLOAD_BYTES."""
    if problem := value_problem(value):
        kind, path = problem
        msg = {
            "too_deep": f"nested deeper than {MAX_NESTING} levels",
            "not_finite": "NaN and Infinity are not JSON numbers",
            "not_unicode": "text with a lone surrogate is not Unicode",
        }[kind]
        path = [safe_text(step) if isinstance(step, str) else step for step in path]
        where = "".join(f"[{step!r}]" if isinstance(step, int) else f".{step}" for step in path)
        raise InvalidInput(
            f"{what}{' at ' + where.lstrip('.') if where else ''}: {msg}",
            [{"loc": list(path), "msg": msg, "type": kind}],
        )
    limit = settings.GRUNDLAG_MAX_PAYLOAD_BYTES if limit is None else limit
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > limit:
        raise PayloadTooLarge(f"{what} is {size} bytes; the limit is {limit} bytes")


class Unread(enum.Enum):
    """A step's resumption that its caller does not know: the step reads it (last_resumption)."""

    UNREAD = "unread"


UNREAD = Unread.UNREAD

# The events of the transaction open in _atomic(), written together before it commits.
_journal: ContextVar[list[list[Any]] | None] = ContextVar("grundlag_journal", default=None)


@contextmanager
def _atomic() -> Iterator[None]:
    """``transaction.atomic()`` whose audit events are written in one INSERT, as it ends, and
    whose engine statements share a cursor."""
    events: list[list[Any]] = []
    with transaction.atomic(), store.one_cursor():
        token = _journal.set(events)
        try:
            yield
        finally:
            # Reset before the commit: steps that run after it (inline) keep their own.
            _journal.reset(token)
        _write_events(events)


def _log(
    run: Run | int,
    kind: str,
    by: Actor = None,
    interrupt: Interrupt | None = None,
    **detail: Any,
) -> None:
    """Append an event to the run's log: in the open _atomic() block's journal, or now."""
    user = actor_user(by)
    event = [
        run if isinstance(run, int) else run.pk,
        interrupt.pk if interrupt is not None else None,
        kind,
        user.pk if user is not None else None,
        actor_name(by),
        store.Json(detail),
        timezone.now(),
    ]
    journal = _journal.get()
    if journal is not None:
        journal.append(event)
    else:
        _write_events([event])


def _write_events(events: list[list[Any]]) -> None:
    if not events:
        return
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(events))
    store.execute(
        "INSERT INTO actions_runevent (run_id, interrupt_id, kind, actor_id, actor_name, detail, at)"
        f" VALUES {rows}",
        [value for event in events for value in event],
    )


def _inline() -> bool:
    """Whether steps run in the process that queues them (GRUNDLAG_INLINE_STEPS), not in workers."""
    return bool(settings.GRUNDLAG_INLINE_STEPS)


def _enqueue(run_id: int) -> None:
    """Once the transaction that queued the run commits, hand its next step to a worker (or,
    with inline steps, run it here; it is claimed like a worker would)."""
    if _inline():
        _step_after_commit(run_id, lambda: execute_step(run_id))
        return

    def send() -> None:
        from actions.tasks import run_step

        try:
            run_step.delay(run_id)
        except Exception:
            # The run is committed as queued; the sweeper enqueues it again. Nothing is lost.
            logger.exception("could not enqueue run %s; the sweeper will retry", run_id)

    transaction.on_commit(send)


def _hand_over(run: Run, resumption: ActionResumption | None | Unread = UNREAD) -> None:
    """The run's next step runs once this transaction commits: in a worker, which claims the
    queued run; or, with inline steps, here, the run claimed already by this transaction (so
    the claim costs no transaction of its own, and means the same: one holder, one lease).
    ``resumption`` is what an action's step resumes with, when the caller knows it."""
    if run.status != Status.RUNNING:
        _enqueue(run.pk)
        return
    _log(run, RunEvent.Kind.CLAIMED, None, attempt=run.attempt)
    _push_status_after_commit(run, run.status)
    _step_after_commit(run.pk, lambda: _execute_claimed(run, resumption))


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


def _lease(now: Any) -> Any:
    return now + timedelta(seconds=settings.GRUNDLAG_STEP_LEASE_SECONDS)


def _push_after_commit(team_id: int, event: str, **payload: Any) -> None:
    transaction.on_commit(lambda: live.notify_team(team_id, event, **payload))


def _push_status_after_commit(run: Run, status: str) -> None:
    finished = status in Run.FINISHED
    transaction.on_commit(lambda: live.notify_run(run.team_id, run.pk, status, finished=finished))


# Starting


@retry_on_conflict
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
    with _atomic():
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
        if _inline():
            run.status, run.attempt, run.lease_expires_at = Status.RUNNING, 1, _lease(run.created_at)
        store.insert(run)
        _log(run, RunEvent.Kind.STARTED, by, consumer=consumer)
        # Pushes are registered before the step is handed over, so browsers hear of this change
        # before any change the step makes (on_commit callbacks run in order). A run claimed
        # here is announced by the claim.
        if run.status == Status.QUEUED:
            _push_status_after_commit(run, run.status)
        _hand_over(run, resumption=None)  # a new run has not paused
    return run


# Policies


def effective_policy(team_id: int, action_name: str) -> ApprovalPolicy:
    """The action's declared policy, unless the team overrides it (admin: Policies)."""
    overrides = store.fetch(
        Policy, "SELECT * FROM actions_policy WHERE team_id = %s AND action = %s", [team_id, action_name]
    )
    act = registry.find(action_name)
    declared = act.policy if act is not None else ApprovalPolicy()
    if not overrides:
        return declared

    def minutes(value: int | None) -> timedelta | None:
        return timedelta(minutes=value) if value else None

    override = overrides[0]
    return ApprovalPolicy(
        deadline=minutes(override.deadline_minutes),
        default_answer=override.default_answer,
        escalate_after=minutes(override.escalate_after_minutes) if override.escalate_to else None,
        escalate_to=override.escalate_to.slug
        if override.escalate_to and override.escalate_after_minutes
        else None,
        approvals=override.approvals_required or 1,
        assignees=tuple(name.strip() for name in override.assignees.split(",") if name.strip()),
        requester_may_approve=declared.requester_may_approve
        if override.requester_may_approve is None
        else override.requester_may_approve,
    )


def _policy_fields(team_id: int, action_name: str, now: Any) -> dict[str, Any]:
    policy = effective_policy(team_id, action_name)
    escalate_to = Team.objects.filter(slug=policy.escalate_to).first() if policy.escalate_to else None
    return {
        "expires_at": now + policy.deadline if policy.deadline else None,
        "default_answer": policy.default_answer,
        "escalate_at": now + policy.escalate_after if policy.escalate_after and escalate_to else None,
        "escalate_to_id": escalate_to.pk if escalate_to else None,
        "approvals_required": policy.approvals,
        "assignees": list(policy.assignees),
        "requester_may_approve": policy.requester_may_approve,
    }


def may_decide(by: Actor, interrupt: Interrupt) -> bool:
    """Members of its team (or of the team it escalated to), and among them its assignees if
    it names any. A token acts for its team, but is nobody in particular: it cannot be one of
    several required approvers, nor a named assignee."""
    if by is None:
        return True  # the engine itself: a deadline policy
    if isinstance(by, ApiToken):
        return (
            by.team_id in interrupt.team_ids and not interrupt.assignees and interrupt.approvals_required == 1
        )
    if not by.is_authenticated or not Team.objects.filter(pk__in=interrupt.team_ids, members=by.pk).exists():
        return False
    return not interrupt.assignees or by.get_username() in interrupt.assignees


SEPARATION_OF_DUTIES = (
    "Separation of duties: whoever started a run may not approve it "
    "(requester_may_approve is off for {action})."
)


SEPARATION_OF_DUTIES_TOKEN = (
    "Separation of duties: an API token is not a person, so it cannot show that someone other "
    "than the requester approves (requester_may_approve is off for {action})."
)


def separation_of_duties(by: Actor, interrupt: Interrupt) -> str:
    """Why ``by`` may not approve ``interrupt`` because they (may have) started its run, or "".
    A token acts for its whole team, whoever started the run: it may not approve at all.
    Rejecting stays open to everyone: it is how a requester withdraws."""
    if interrupt.requester_may_approve or by is None:
        return ""
    if isinstance(by, ApiToken):
        return SEPARATION_OF_DUTIES_TOKEN.format(action=interrupt.action)
    started_by_id = Run.objects.filter(pk=interrupt.run_id).values_list("started_by_id", flat=True).first()
    own = started_by_id is not None and started_by_id == by.pk
    return SEPARATION_OF_DUTIES.format(action=interrupt.action) if own else ""


def why_not(by: Actor, interrupt: Interrupt) -> str:
    if interrupt.assignees:
        return f"Only {', '.join(interrupt.assignees)} may decide this."
    if isinstance(by, ApiToken) and interrupt.approvals_required > 1:
        return f"This needs {interrupt.approvals_required} people to approve; an API token is not a person."
    return f"Only members of {interrupt.team} can decide this."


# Deciding


def validate_answer(interrupt: Interrupt, data: Any) -> Any:
    """The answer as it will be stored, or InvalidAnswer with field errors."""
    check_size("the answer", data)
    act = registry.find(interrupt.action)
    if act is None:
        return data
    try:
        return act.validate_answer(data)
    except ValidationError as exc:
        raise InvalidAnswer("the answer does not fit the action's answer schema", field_errors(exc)) from None


@retry_on_conflict
def _decide(
    interrupt: Interrupt,
    status: str,
    by: Actor,
    *,
    answer: Any = None,
    reason: str = "",
    then: Callable[[Run, Interrupt], None],
    policy: str = "",
) -> Interrupt:
    """Decide a pending interrupt. ``policy`` names the policy deciding it, when no one does."""
    now = timezone.now()
    with _atomic():
        # Lock the run first: two reviewers deciding two interrupts of one agent turn (or two
        # of N required approvers) must see each other's decision, or neither would resume the
        # run (PostgreSQL; SQLite's IMMEDIATE transactions already serialise writers).
        run = _lock_run(interrupt.run_id)
        (current,) = store.fetch(Interrupt, "SELECT * FROM actions_interrupt WHERE id = %s", [interrupt.pk])
        if current.status != Interrupt.Status.PENDING:
            raise AlreadyDecided(current)
        if not policy and not may_decide(by, current):
            raise NotAllowed(why_not(by, current))
        if not policy and status == Interrupt.Status.APPROVED and (rule := separation_of_duties(by, current)):
            raise NotAllowed(rule)
        counted_detail: dict[str, Any] = {}
        if status == Interrupt.Status.APPROVED and current.approvals_required > 1 and not policy:
            agreed = _count_approval(run, current, by, answer)
            if agreed is None:
                return current
            answer = agreed
            counted_detail = {"approvals": current.approvals_required, "of": current.approvals_required}
            if restarted := getattr(current, "count_restarted", None):
                counted_detail.update(restarted=True, superseded=restarted)
        # The conditional UPDATE is the decision: of two reviewers clicking at once, exactly one
        # changes a pending row; the other changes nothing and is told who won.
        user = actor_user(by)
        decision = {
            "status": status,
            "answer": answer,
            "reason": reason,
            "decided_by": user,
            "decided_by_name": policy or actor_name(by),
            "decided_at": now,
        }
        won = store.execute(
            """UPDATE actions_interrupt
               SET status = %s, answer = %s, reason = %s, decided_by_id = %s, decided_by_name = %s,
                   decided_at = %s
               WHERE id = %s AND status = %s""",
            [
                status,
                store.Json(answer),
                reason,
                user.pk if user is not None else None,
                decision["decided_by_name"],
                now,
                current.pk,
                Interrupt.Status.PENDING,
            ],
        )
        if not won:
            raise AlreadyDecided(Interrupt.objects.get(pk=current.pk))
        for name, value in decision.items():
            setattr(current, name, value)
        interrupt = current
        kinds: dict[str, str] = {
            Interrupt.Status.APPROVED: RunEvent.Kind.APPROVED,
            Interrupt.Status.EXPIRED: RunEvent.Kind.EXPIRED,
        }
        kind = kinds.get(status, RunEvent.Kind.REJECTED)
        detail: dict[str, Any] = {"seq": interrupt.seq, **counted_detail}
        if reason:
            detail["reason"] = reason
        if policy:
            detail["policy"] = policy
        _log(run, kind, by, interrupt, **detail)
        for team_id in interrupt.team_ids:
            _push_after_commit(
                team_id,
                "decided",
                run_id=run.pk,
                interrupt_id=interrupt.pk,
                status=interrupt.status,
                decided_by=interrupt.decided_by_name,
            )
        then(run, interrupt)
    return interrupt


def _lock_run(run_id: int) -> Run:
    """The run, locked until the transaction ends. On SQLite the IMMEDIATE transaction holds
    the database's write lock already, so nothing is read until a field is used."""
    if not connection.features.has_select_for_update:
        return Run.from_db(DEFAULT_DB_ALIAS, ["id"], [run_id])
    (run,) = store.fetch(
        Run, "SELECT id, team_id, consumer, status FROM actions_run WHERE id = %s FOR UPDATE", [run_id]
    )
    return run


def agreement_key(action_name: str, answer: Any) -> str:
    """What two approvals must share to count towards the same answer. With the plain
    approve form, each person's comment is their own: only the decision counts. A typed answer
    counts whole: approving "notify the customer" is not approving "do not"."""
    act = registry.find(action_name)
    if (act is None or act.answer_model is None) and isinstance(answer, dict) and "approved" in answer:
        answer = {key: value for key, value in answer.items() if key != "comment"}
    return arguments_hash(answer)


def counted_approvals(interrupt: Interrupt) -> list[Approval]:
    """The approvals that count now: all for the same answer, oldest first."""
    return list(interrupt.approvals.filter(superseded_at=None).select_related("user").order_by("at", "id"))


def _count_approval(run: Run, interrupt: Interrupt, by: Actor, answer: Any) -> Any | None:
    """Record one of N required approvals. Returns the answer to resume with when this one
    completes N approvals of the same answer, else None.

    N approvals count towards one answer: an approval whose answer differs from the ones
    counted so far supersedes them (they stay, for the transcript) and the count starts again
    from it, so the run never receives an answer that fewer than N people approved."""
    user = actor_user(by)
    if user is None:
        raise NotAllowed(why_not(by, interrupt))
    counted = counted_approvals(interrupt)
    if any(approval.user_id == user.pk for approval in counted):
        raise NotAllowed(
            f"You already approved this; it needs {interrupt.approvals_required} different people."
        )
    superseded: list[str] = []
    if counted and agreement_key(interrupt.action, counted[0].answer) != agreement_key(
        interrupt.action, answer
    ):
        superseded = [approval.user.get_username() for approval in counted]
        Approval.objects.filter(pk__in=[approval.pk for approval in counted]).update(
            superseded_at=timezone.now()
        )
        counted = []
    Approval.objects.create(interrupt=interrupt, user=user, answer=answer)
    count = len(counted) + 1
    interrupt.count_restarted = superseded  # type: ignore[attr-defined]
    if count >= interrupt.approvals_required:
        return answer
    detail: dict[str, Any] = {
        "seq": interrupt.seq,
        "approvals": count,
        "of": interrupt.approvals_required,
        "answer": answer,  # each approver's own, for the transcript: the run gets the agreed one
    }
    if superseded:
        # Said in the log as on the page: the earlier approvals were for another answer.
        detail["restarted"] = True
        detail["superseded"] = superseded
    _log(run, RunEvent.Kind.APPROVED, by, interrupt, **detail)
    for team_id in interrupt.team_ids:
        _push_after_commit(team_id, "approval", run_id=run.pk, interrupt_id=interrupt.pk, status="pending")
    return None


def _queue_if_nothing_pending(run: Run, interrupt: Interrupt) -> None:
    # An agent turn may pause on several tool calls; the run goes on when the last is decided.
    now, inline = timezone.now(), _inline()
    queued = store.fetch(
        Run,
        f"""UPDATE actions_run
            SET status = %s, updated_at = %s, attempt = attempt + %s, lease_expires_at = %s
            WHERE id = %s AND status = %s
              AND NOT EXISTS (SELECT 1 FROM actions_interrupt WHERE run_id = %s AND status = %s)
            RETURNING {CLAIMED_COLUMNS}""",
        [
            Status.RUNNING if inline else Status.QUEUED,
            now,
            1 if inline else 0,
            _lease(now) if inline else None,
            run.pk,
            Status.INTERRUPTED,
            run.pk,
            Interrupt.Status.PENDING,
        ],
    )
    if queued:
        _log(run, RunEvent.Kind.RESUMED, None, interrupt, seq=interrupt.seq)
        # An action pauses once per step, so the interrupt decided last is its latest: the
        # step resumes with its answer and checkpoint (an agent's or a script's driver reads
        # its own).
        approved = interrupt.status == Interrupt.Status.APPROVED
        _hand_over(queued[0], ActionResumption(interrupt.answer, interrupt.state) if approved else UNREAD)


def resume(interrupt: Interrupt, data: Any, by: Actor) -> Interrupt:
    """Approve ``interrupt`` with ``data`` as the answer and queue the run to go on.

    Raises InvalidAnswer (nothing changed) or AlreadyDecided (someone else was first).
    """
    answer = validate_answer(interrupt, data)
    return _decide(interrupt, Interrupt.Status.APPROVED, by, answer=answer, then=_queue_if_nothing_pending)


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

    return _decide(interrupt, Interrupt.Status.REJECTED, by, reason=reason, then=end_or_go_on)


def _finish_with_pending_cancelled(run: Run, status: str, *, error: str = "", by: Actor = None) -> None:
    """End the run; its interrupts still pending are cancelled, and every inbox that shows one
    (its team's, and a team's it escalated to) is told."""
    now = timezone.now()
    pending = list(Interrupt.objects.filter(run_id=run.pk, status=Interrupt.Status.PENDING))
    Interrupt.objects.filter(pk__in=[it.pk for it in pending], status=Interrupt.Status.PENDING).update(
        status=Interrupt.Status.CANCELLED,
        decided_at=now,
        decided_by=actor_user(by),
        decided_by_name=actor_name(by),
    )
    for it in pending:
        for team_id in it.team_ids:
            _push_after_commit(
                team_id, "decided", run_id=run.pk, interrupt_id=it.pk, status=Interrupt.Status.CANCELLED
            )
    Run.objects.filter(pk=run.pk).update(
        status=status, error=error, finished_at=now, updated_at=now, lease_expires_at=None
    )


@retry_on_conflict
def cancel(run: Run, by: Actor) -> None:
    with _atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.is_finished:
            raise NotCancellable(f"run {run.pk} is already {locked.status}")
        _finish_with_pending_cancelled(locked, Status.CANCELLED, by=by)
        _log(locked, RunEvent.Kind.CANCELLED, by)
        _push_status_after_commit(locked, Status.CANCELLED)


# Executing a step (what a worker does)


def arguments_hash(arguments: Any) -> str:
    """The SHA-256 of the arguments' canonical JSON: equal for equal values, whatever the
    order of their keys or spacing."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def call_binding(
    action: str, arguments: Any = None, *, turn: int | None = None, position: int | None = None
) -> dict[str, Any]:
    """What an approval is bound to: the call it was shown for, and no other.

    A driver passes what identifies its calls (an agent: the turn and position of the tool
    call; a script: the position in its call log) and the arguments; a plain action, its name
    only (each of its steps pauses at most once, and an answer resumes the step after it)."""
    binding: dict[str, Any] = {"action": action}
    if turn is not None:
        binding["turn"] = turn
    if position is not None:
        binding["position"] = position
    if turn is not None or position is not None:
        binding["arguments_sha256"] = arguments_hash(arguments)
    return binding


@dataclass(frozen=True)
class Pause:
    message: str
    data: Any
    state: Any
    tool_call_id: str = ""
    action: str = ""
    # The call it pauses (call_binding): its answer resumes only a call with the same binding.
    binding: dict[str, Any] = field(default_factory=dict)


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


def last_resumption(run: Run, binding: dict[str, Any]) -> ActionResumption | None:
    """The answer and checkpoint of the run's latest interrupt, if it was approved for the
    call ``binding`` names. An answer given for another call resumes nothing: that call pauses
    again and asks its own question."""
    latest = store.fetch(
        Interrupt,
        "SELECT id, status, answer, state, binding FROM actions_interrupt"
        " WHERE run_id = %s ORDER BY seq DESC LIMIT 1",
        [run.pk],
    )
    last = latest[0] if latest else None
    if last is None or last.status != Interrupt.Status.APPROVED:
        return None
    if last.binding != binding:
        logger.warning(
            "run %s: the answer to interrupt %s was given for %s, not for %s; not resuming with it",
            run.pk,
            last.pk,
            last.binding,
            binding,
        )
        return None
    return ActionResumption(data=last.answer, state=last.state)


def public_error(run_id: int | None, outcome: Failed) -> str:
    """What callers are told of a failed action. An unexpected exception's text may carry
    anything (a path, a DSN, a key): it goes to the server's log and, as an ``error`` event,
    to the admin, under an id that the caller's stable message names."""
    if not outcome.unexpected:
        return outcome.error
    return report_internal_error(run_id, outcome.error)


def report_internal_error(run_id: int | None, text: str) -> str:
    error_id = uuid.uuid4().hex[:12]
    logger.error("run %s: internal error %s: %s", run_id, error_id, text)
    if run_id is not None:
        _log(run_id, RunEvent.Kind.ERROR, None, error_id=error_id, exception=text)
    return f"the action failed with an internal error (error id {error_id}; details in the server log)"


def pending_interrupts(run_id: int) -> list[Interrupt]:
    """The run's pending interrupts, in order: what a program that drives runs itself (with
    inline steps, the way LangGraph's invoke returns the interrupt) answers next."""
    return store.fetch(
        Interrupt,
        "SELECT * FROM actions_interrupt WHERE run_id = %s AND status = %s ORDER BY seq",
        [run_id, Interrupt.Status.PENDING],
    )


def step_action(action_name: str, input: Any, resumption: ActionResumption | None, run_id: int) -> StepResult:  # noqa: A002
    outcome = invoke(action_name, input, resumption, run_id=run_id)
    if isinstance(outcome, Completed):
        return StepResult(Status.COMPLETED, output=outcome.output)
    if isinstance(outcome, Interrupted):
        binding = call_binding(action_name)
        pause = Pause(outcome.message, outcome.data, outcome.state, action=action_name, binding=binding)
        return StepResult(Status.INTERRUPTED, pauses=[pause])
    assert isinstance(outcome, Failed)
    return StepResult(Status.FAILED, error=public_error(run_id, outcome))


# What a step needs of its run: it reads nothing else of it.
CLAIMED_COLUMNS = "id, action, input, team_id, consumer, status, attempt, driver_state"


@retry_on_conflict
def execute_step(run_id: int) -> None:
    """Claim the run's queued step, run it, and record how it ended. Idempotent."""
    now = timezone.now()
    with _atomic():
        # The claim: of two deliveries of the same message (at-least-once), or two workers,
        # exactly one moves the run from queued to running; the other returns, running nothing.
        claimed = store.fetch(
            Run,
            f"""UPDATE actions_run
                SET status = %s, attempt = attempt + 1, lease_expires_at = %s, updated_at = %s
                WHERE id = %s AND status = %s
                RETURNING {CLAIMED_COLUMNS}""",
            [Status.RUNNING, _lease(now), now, run_id, Status.QUEUED],
        )
        if not claimed:
            return
        (run,) = claimed
        _log(run, RunEvent.Kind.CLAIMED, None, attempt=run.attempt)
        _push_status_after_commit(run, run.status)
    _execute_claimed(run)


def _execute_claimed(run: Run, resumption: ActionResumption | None | Unread = UNREAD) -> None:
    """Run the step of a run this process holds the lease of, and record how it ended."""
    driver = DRIVERS.get(run.consumer)
    try:
        if driver is not None:
            result = driver.step(run)
        else:
            if resumption is UNREAD:
                resumption = last_resumption(run, call_binding(run.action))
            result = step_action(run.action, run.input, resumption, run.pk)
    except Exception as exc:
        logger.exception("step of run %s crashed in the engine", run.pk)
        result = StepResult(
            Status.FAILED, error=report_internal_error(run.pk, f"{type(exc).__name__}: {exc}")
        )
    record(run, result)


def _storing_problem(what: str, value: Any, factor: int = 1) -> str:
    try:
        check_size(what, value, limit=settings.GRUNDLAG_MAX_PAYLOAD_BYTES * factor)
    except EngineError as exc:
        return str(exc)
    return ""


def _result_problem(result: StepResult) -> str:
    if result.status == Status.COMPLETED:
        return _storing_problem("the output", result.output)
    for pause in result.pauses:
        if problem := _storing_problem("the interrupt's data", pause.data) or _storing_problem(
            "the checkpoint", pause.state
        ):
            return problem
    return ""


@retry_on_conflict
def record(run: Run, result: StepResult) -> None:
    now = timezone.now()
    if result.status == Status.INTERRUPTED and not result.pauses:
        # Nothing to answer would leave the run waiting forever: a driver's defect, said so.
        logger.error("run %s: a step reported interrupted with no pause", run.pk)
        result = StepResult(Status.FAILED, error="the step paused without saying on what (an engine defect)")
    # What is stored is shown on pages, in exports and in the admin: a value too deep (or not
    # JSON) is refused here, for every driver, and the run fails saying which.
    # Text from an action or a script (an error, a pause's message) is whatever it raised:
    # bounded, and escaped where a database could not store it.
    result.error = safe_text(result.error, MAX_ERROR_CHARS)
    result.pauses = [
        dataclasses.replace(pause, message=safe_text(pause.message, MAX_ERROR_CHARS))
        for pause in result.pauses
    ]
    state_problem = _storing_problem("the driver's state", run.driver_state, DRIVER_STATE_LIMIT_FACTOR)
    problem = state_problem or _result_problem(result)
    if problem:
        logger.warning("run %s: %s", run.pk, problem)
        result = StepResult(Status.FAILED, error=f"the step's result cannot be stored: {problem}")
    with _atomic():
        # Only the holder of the current lease may record: if the sweeper re-queued this run
        # (we were presumed dead) and another worker claimed it, our late result is dropped.
        # A running step has no output, error or end yet, so each is set to what this step gave.
        finished = result.status in Run.FINISHED
        # A driver's state that cannot be stored is not: the run keeps the one it had.
        state_sql = "driver_state" if state_problem else "%s"
        state_params = [] if state_problem else [store.Json(run.driver_state)]
        recorded = store.execute(
            f"""UPDATE actions_run
               SET status = %s, updated_at = %s, lease_expires_at = NULL, driver_state = {state_sql},
                   output = %s, error = %s, finished_at = %s
               WHERE id = %s AND status = %s AND attempt = %s""",
            [
                result.status,
                now,
                *state_params,
                store.Json(result.output if result.status == Status.COMPLETED else None),
                result.error if result.status == Status.FAILED else "",
                now if finished else None,
                run.pk,
                Status.RUNNING,
                run.attempt,
            ],
        )
        if not recorded:
            logger.warning("run %s attempt %s lost its lease; result dropped", run.pk, run.attempt)
            return
        if result.status == Status.INTERRUPTED:
            for pause in result.pauses:
                action_name = pause.action or run.action
                interrupt = Interrupt(
                    run_id=run.pk,
                    team_id=run.team_id,
                    action=action_name,
                    message=pause.message,
                    data=pause.data,
                    state=pause.state,
                    tool_call_id=pause.tool_call_id,
                    binding=pause.binding or call_binding(action_name),
                    **_policy_fields(run.team_id, action_name, now),
                )
                store.insert(interrupt, _next_seq(run.pk))
                _log(run, RunEvent.Kind.INTERRUPTED, None, interrupt, seq=interrupt.seq)
                _push_after_commit(
                    run.team_id, "interrupt", run_id=run.pk, interrupt_id=interrupt.pk, status="pending"
                )
        elif result.status == Status.COMPLETED:
            _log(run, RunEvent.Kind.COMPLETED, None)
        else:
            _log(run, RunEvent.Kind.FAILED, None, error=result.error)
        _push_status_after_commit(run, result.status)


def _next_seq(run_id: int) -> tuple[str, str, list[Any]]:
    """An interrupt's number in its run: one more than the run's last, counted as it is inserted."""
    return ("seq", "(SELECT COALESCE(MAX(seq), 0) + 1 FROM actions_interrupt WHERE run_id = %s)", [run_id])


# Recovering


def _requeues_of_this_step(run_id: int) -> int:
    """How often the run's current step was re-queued: since it started or last resumed."""
    progress = (
        RunEvent.objects.filter(run_id=run_id, kind__in=[RunEvent.Kind.STARTED, RunEvent.Kind.RESUMED])
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.REQUEUED, id__gt=progress or 0).count()


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
    for run_id, attempt, team_id in running.values_list("pk", "attempt", "team_id"):
        with _atomic():
            if _requeues_of_this_step(run_id) >= settings.GRUNDLAG_MAX_STEP_REQUEUES:
                # A step that never gets to record (it kills its worker, or its result cannot be
                # written) would otherwise run again at every lease's end, forever.
                error = (
                    f"the step was re-queued {settings.GRUNDLAG_MAX_STEP_REQUEUES} times without "
                    "recording how it ended (GRUNDLAG_MAX_STEP_REQUEUES); see the server log"
                )
                if Run.objects.filter(pk=run_id, status=Status.RUNNING, attempt=attempt).update(
                    status=Status.FAILED, error=error, finished_at=now, updated_at=now, lease_expires_at=None
                ):
                    _log(run_id, RunEvent.Kind.FAILED, None, error=error)
                    _push_status_after_commit(Run(pk=run_id, team_id=team_id), Status.FAILED)
                continue
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


def _fail_expired(run: Run, interrupt: Interrupt) -> None:
    assert interrupt.expires_at is not None
    expired_at = timezone.localtime(interrupt.expires_at).strftime("%Y-%m-%d %H:%M %Z")
    _finish_with_pending_cancelled(
        run, Status.FAILED, error=f"the approval expired at {expired_at} without a decision"
    )


def _fail_invalid_default(message: str) -> Callable[[Run, Interrupt], None]:
    def fail(run: Run, interrupt: Interrupt) -> None:
        _finish_with_pending_cancelled(run, Status.FAILED, error=message)

    return fail


def _apply_deadline(interrupt: Interrupt) -> None:
    """The deadline passed: approve with the policy's default answer, validated now as a
    reviewer's answer would be (the action's answer model may have changed since it was
    declared), or expire the interrupt and fail the run, saying why."""
    if interrupt.default_answer is None:
        _decide(
            interrupt,
            Interrupt.Status.EXPIRED,
            None,
            reason="deadline passed",
            then=_fail_expired,
            policy="deadline policy",
        )
        return
    try:
        answer = validate_answer(interrupt, interrupt.default_answer)
    except (InvalidInput, PayloadTooLarge) as exc:
        errors = describe_errors(getattr(exc, "errors", []), "answer")
        message = f"the deadline passed and its default answer is invalid: {exc}" + (
            f" ({errors})" if errors else ""
        )
        logger.error("interrupt %s: %s", interrupt.pk, message)
        _decide(
            interrupt,
            Interrupt.Status.EXPIRED,
            None,
            reason=message,
            then=_fail_invalid_default(message),
            policy="deadline policy",
        )
        return
    _decide(
        interrupt,
        Interrupt.Status.APPROVED,
        None,
        answer=answer,
        then=_queue_if_nothing_pending,
        policy="deadline policy",
    )


@retry_on_conflict
def _escalate(interrupt: Interrupt, target: Team, now: Any) -> bool:
    with _atomic():
        # The run first, then the interrupt: the lock order of every change (see _decide), so an
        # escalation and a decision of the same interrupt wait for each other, never deadlock.
        _lock_run(interrupt.run_id)
        escalated = Interrupt.objects.filter(
            pk=interrupt.pk, status=Interrupt.Status.PENDING, escalated_at=None
        ).update(escalated_at=now)
        if not escalated:
            return False
        _log(interrupt.run_id, RunEvent.Kind.ESCALATED, None, interrupt, to=target.slug)
        for team_id in (interrupt.team_id, target.pk):
            _push_after_commit(
                team_id,
                "interrupt",
                run_id=interrupt.run_id,
                interrupt_id=interrupt.pk,
                status="pending",
            )
    return True


def apply_policies(now: Any = None) -> int:
    """Fire due deadlines and escalations. Each is a conditional change on a pending
    interrupt, so it happens once, and a reviewer deciding at the same moment either wins
    (the policy then does nothing) or is told the policy decided first."""
    now = now or timezone.now()
    count = 0
    for interrupt in Interrupt.objects.filter(status=Interrupt.Status.PENDING, expires_at__lte=now):
        try:
            _apply_deadline(interrupt)
            count += 1
        except AlreadyDecided:
            pass  # a reviewer was first
        except Busy:
            logger.warning("deadline of interrupt %s met conflicts; the next round retries it", interrupt.pk)
    due = Interrupt.objects.filter(
        status=Interrupt.Status.PENDING, escalate_at__lte=now, escalated_at=None, escalate_to__isnull=False
    ).select_related("escalate_to")
    for interrupt in due:
        target = interrupt.escalate_to
        assert target is not None
        try:
            if _escalate(interrupt, target, now):
                count += 1
        except Busy:
            logger.warning(
                "escalation of interrupt %s met conflicts; the next round retries it", interrupt.pk
            )
    return count
