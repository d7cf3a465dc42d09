"""The transaction journal: what an engine change writes besides the rows it changes.

An engine change runs in ``atomic()``. Its audit events are collected as it goes and written
in one INSERT as it ends, in the same transaction. What changed is announced after it commits
(a rolled-back change tells no one anything), as the signals ``team_changed`` and
``run_changed``: the web layer (actions.web.live) pushes them to open pages.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from actions.core import Failed
from actions.engine import store
from actions.models import Actor, Interrupt, Run, RunEvent, actor_name, actor_user

logger = logging.getLogger(__name__)

# The events of the transaction open in atomic(), written together before it commits.
_journal: ContextVar[list[list[Any]] | None] = ContextVar("grundlag_journal", default=None)


@contextmanager
def atomic() -> Iterator[None]:
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
        store.insert_events(events)


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
        store.Json(detail),
        timezone.now(),
    ]
    journal = _journal.get()
    if journal is not None:
        journal.append(event)
    else:
        store.insert_events([event])


# Sent after commit. team_changed: team_id, event ("interrupt", "decided", "approval") and
# payload (run_id, interrupt_id, status...). run_changed: team_id, run_id, status, finished.
team_changed = Signal()
run_changed = Signal()


def push_team(team_id: int, event: str, **payload: Any) -> None:
    """Announce a change of the team's inbox, once this transaction commits."""
    # robust: a push that fails must not keep the callbacks after it (a step's hand-over) from running.
    transaction.on_commit(
        lambda: team_changed.send(Run, team_id=team_id, event=event, payload=payload), robust=True
    )


def push_run_status(run: Run, status: str) -> None:
    """Announce the run's new status, once this transaction commits."""
    finished = status in Run.FINISHED
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
