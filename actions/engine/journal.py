"""The transaction journal: what an engine change writes besides the rows it changes.

An engine change runs in ``atomic()``. Its audit events are collected as it goes and written
as it ends, in the same transaction: one INSERT on SQLite, one call of the server's
``grundlag_append_journal`` on PostgreSQL (with the inbox streams' numbers), sent with the
transaction's COMMIT where it can be. What changed is announced after it commits (a
rolled-back change tells no one anything), as the signals ``team_changed`` and ``run_changed``:
actions.live pushes them to open pages and wakes the requests waiting on them; actions.notify
tells whom they concern.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from actions.core import Failed
from actions.engine import audit, idempotency
from actions.engine.sql import Json, one_cursor
from actions.models import Actor, Interrupt, Run, RunEvent, actor_name, actor_user

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class InboxChange:
    """A change of the teams' inboxes: an interrupt entered, left or changed in them.

    ``before`` and ``after`` are the teams whose inbox showed it before and after the change
    (empty when it was created or decided), so a page can tell, without asking the server,
    whether its own view of it changed. ``seq`` holds, for each team involved, the change's
    number in that team's inbox stream, given as the transaction commits."""

    event: str  # "interrupt" (created), "escalated", "approval" (one of N counted), "decided"
    run_id: int
    interrupt_id: int
    action: str
    before: tuple[int, ...]
    after: tuple[int, ...]
    status: str = Interrupt.Status.PENDING
    decided_by: str = ""
    created_at: datetime | None = None
    seq: dict[int, int] = field(default_factory=dict)

    @property
    def team_ids(self) -> list[int]:
        return sorted(set(self.before) | set(self.after))


@dataclass(slots=True)
class _Journal:
    events: list[list[Any]] = field(default_factory=list)
    changes: list[InboxChange] = field(default_factory=list)


# What the transaction open in atomic() writes besides its rows, written as it ends.
_journal: ContextVar[_Journal | None] = ContextVar("grundlag_journal", default=None)


@contextmanager
def atomic() -> Iterator[None]:
    """``transaction.atomic()`` whose audit events are written as it ends (see above), whose
    inbox changes are numbered in their teams' streams, and whose engine statements share a
    cursor. Inside another, it is a savepoint that writes into the outer one's journal (a rule
    deciding the interrupt its step just recorded: the events stay in order), and takes back
    what it wrote there if it fails."""
    outer = _journal.get()
    if outer is not None:
        marks = len(outer.events), len(outer.changes)
        try:
            with transaction.atomic():
                yield
        except BaseException:
            del outer.events[marks[0] :], outer.changes[marks[1] :]
            raise
        return
    journal = _Journal()
    keyed = False
    try:
        with transaction.atomic(), one_cursor():
            token = _journal.set(journal)
            try:
                yield
            finally:
                # Reset before the commit: steps that run after it (inline) keep their own.
                _journal.reset(token)
            # The API request this change is made for keeps its Idempotency-Key with it.
            keyed = idempotency.record(journal.events[0][0] if journal.events else None)
            # The transaction's last statement: on PostgreSQL it may go with the COMMIT, the
            # changes numbered as it commits, before the on_commit callbacks announce them.
            audit.append(
                journal.events,
                _counts(journal.changes),
                numbered=partial(_number, journal.changes),
                last=True,
            )
    except BaseException:
        if keyed:
            idempotency.forget()
        raise


def _counts(changes: list[InboxChange]) -> dict[int, int]:
    """How many of the changes each team's inbox stream numbers."""
    counts: dict[int, int] = {}
    for change in changes:
        for team_id in change.team_ids:
            counts[team_id] = counts.get(team_id, 0) + 1
    return counts


def _number(changes: list[InboxChange], last: dict[int, int]) -> None:
    """Number the changes in their teams' streams, given each team's new last number."""
    last = dict(last)
    for change in reversed(changes):
        for team_id in change.team_ids:
            change.seq[team_id] = last[team_id]
            last[team_id] -= 1


def log(
    run: Run | int,
    kind: str,
    by: Actor = None,
    interrupt: Interrupt | None = None,
    **detail: Any,
) -> None:
    """Append an event to the run's log: in the open atomic() block's journal, or now."""
    user = actor_user(by)
    event = [
        run if isinstance(run, int) else run.pk,
        interrupt.pk if interrupt is not None else None,
        kind,
        user.pk if user is not None else None,
        actor_name(by),
        Json(detail),
        timezone.now(),
    ]
    journal = _journal.get()
    if journal is not None:
        journal.events.append(event)
    else:
        audit.append([event])


# The event each way a run can end is logged as (the one subscribers hear as run.finished).
_ENDED: dict[str, str] = {
    Run.Status.COMPLETED: RunEvent.Kind.COMPLETED,
    Run.Status.FAILED: RunEvent.Kind.FAILED,
    Run.Status.REJECTED: RunEvent.Kind.REJECTED,
    Run.Status.CANCELLED: RunEvent.Kind.CANCELLED,
}


def log_end(run: Run | int, status: str, by: Actor = None, *, output: Any = None, error: str = "") -> None:
    """Log how the run ended, with its error when it has one and the digest of its row's end
    (audit.run_record: the chain covers what the audit shows), in the transaction that ends it."""
    detail: dict[str, Any] = {"record": audit.run_record(status, output, error)}
    if error:
        detail["error"] = error
    log(run, _ENDED[status], by, **detail)


# Sent after commit. team_changed: changes, the transaction's InboxChanges in order, each
# numbered in its teams' streams. run_changed: team_id, run_id, status, finished.
team_changed = Signal()
run_changed = Signal()
# Sent after commit: someone commented on an interrupt (run_id, interrupt_id, mentions). Pages
# showing the run fetch the thread again; mentions are told. The run itself did not change.
discussed = Signal()
# Sent after the reminders of deadlines near were logged: runs (their ids). Their reviewers are
# told (actions.notify).
reminded = Signal()
# Sent by the process that ran a step, once it is recorded: action, status, seconds (the step
# itself), queued_seconds (from its message being sent to its claim; None when not known).
step_ran = Signal()


def inbox_changed(
    event: str,
    interrupt: Interrupt,
    *,
    before: list[int] | tuple[int, ...],
    after: list[int] | tuple[int, ...],
    decided_by: str = "",
) -> None:
    """Announce, once the transaction open in atomic() commits, that the interrupt entered,
    left or changed in the inboxes of these teams."""
    journal = _journal.get()
    if journal is None:
        raise RuntimeError("inbox changes are announced from inside the engine's atomic()")
    if not journal.changes:
        # Sent where the first change was made among the transaction's after-commit work (before
        # a step it hands over, which may run inline), numbered by then. robust: a push that
        # fails must not keep the callbacks after it from running.
        changes = journal.changes
        transaction.on_commit(lambda: team_changed.send(Run, changes=changes), robust=True)
    journal.changes.append(
        InboxChange(
            event=event,
            run_id=interrupt.run_id,
            interrupt_id=interrupt.pk,
            action=interrupt.action,
            before=tuple(before),
            after=tuple(after),
            status=interrupt.status,
            decided_by=decided_by,
            # Read without loading it: a row read in part by the store defers the rest.
            created_at=interrupt.__dict__.get("created_at"),
        )
    )


def push_run_status(run: Run, status: str) -> None:
    """Announce the run's new status, once this transaction commits."""
    finished = status in Run.FINISHED
    # Other processes hear of it from PostgreSQL itself: a trigger NOTIFYs a run's change to a
    # settled status as its transaction commits (migration 0018, actions.live.waiting).
    transaction.on_commit(
        lambda: run_changed.send(Run, team_id=run.team_id, run_id=run.pk, status=status, finished=finished),
        robust=True,
    )


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
        log(run_id, RunEvent.Kind.ERROR, None, error_id=error_id, exception=text)
    return f"the action failed with an internal error (error id {error_id}; details in the server log)"
