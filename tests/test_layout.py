"""The layout's promises, checked on the source: every state change of a run or an interrupt is
in actions/engine, and every SQL statement written by hand is in actions/engine/store.py (or
in actions/engine/sql.py, which runs them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ACTIONS = Path(__file__).resolve().parent.parent / "actions"
STATUS_FIELDS = {"status", "decided_at", "decided_by", "lease_expires_at", "finished_at"}
WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}
# A statement (not the word "UPDATE" in a comment), or a way to run one past the ORM.
SQL = [
    r"\bSELECT\s.+\sFROM\s",
    r"\bUPDATE\s+\S+\s+SET\b",
    r"\bINSERT\s+INTO\b",
    r"\bDELETE\s+FROM\b",
    r"\.cursor\(\)",
    r"\.raw\(",
    r"\bRawSQL\b",
]


def _sources(*, outside: str) -> list[Path]:
    return [
        path
        for path in sorted(ACTIONS.rglob("*.py"))
        if "migrations" not in path.parts and not path.is_relative_to(ACTIONS / outside)
    ]


def _assigns_a_status(node: ast.AST) -> bool:
    """`x.status = ...`, also among several targets (`x.status, y = ...`)."""
    if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    return any(isinstance(t, ast.Attribute) and t.attr in STATUS_FIELDS for t in flat)


def _writes_a_status(node: ast.AST) -> bool:
    """`setattr(x, "status", ...)`, or `update()`/`create()` and the like given a status."""
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) > 1:
        name = node.args[1]
        return isinstance(name, ast.Constant) and name.value in STATUS_FIELDS
    return (
        isinstance(node.func, ast.Attribute)
        and node.func.attr in WRITES
        and any(keyword.arg in STATUS_FIELDS for keyword in node.keywords)
    )


def _status_writes(tree: ast.AST) -> list[int]:
    """The lines that write a run's or an interrupt's status (or its end, decider or lease)."""
    return sorted(
        node.lineno  # type: ignore[attr-defined]
        for node in ast.walk(tree)
        if _assigns_a_status(node) or _writes_a_status(node)
    )


def test_nothing_outside_the_engine_writes_a_runs_or_an_interrupts_status() -> None:
    found = {
        str(path.relative_to(ACTIONS.parent)): lines
        for path in _sources(outside="engine")
        if (lines := _status_writes(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_checks_see_a_status_or_a_statement_written_outside_the_engine() -> None:
    assert all(re.search(pattern, (ACTIONS / "engine" / "store.py").read_text()) for pattern in SQL[:3])
    written = ast.parse(
        "Run.objects.filter(pk=1).update(status='failed')\nit.status = 'approved'\nok = it.status\n"
        "it.status, n = 'x', 1\nsetattr(it, 'status', 'x')"
    )
    assert _status_writes(written) == [1, 2, 4, 5]


@pytest.mark.parametrize("statement", SQL)
def test_sql_is_written_only_in_the_engines_store(statement: str) -> None:
    allowed = {ACTIONS / "engine" / "store.py", ACTIONS / "engine" / "sql.py"}
    holders = [
        str(path.relative_to(ACTIONS.parent))
        for path in _sources(outside="engine/store.py")
        if re.search(statement, path.read_text()) and path not in allowed
    ]
    assert holders == []


def test_the_queue_hands_runs_to_the_steps_runner_once_the_engine_is_loaded() -> None:
    """The queue sits below the decisions, which hand runs over; what runs a step is registered
    by actions.engine.steps as the engine's package loads it. Were that import dropped, every
    hand-over would fail after its commit, logged and left to the sweeper."""
    from actions.engine import queue, steps

    runner = queue._executor()
    assert runner.queued is steps.execute_step and runner.claimed is steps._execute_claimed


def test_every_task_named_anywhere_is_registered() -> None:
    """Background work is sent by its task's name (actions.background); the routes and beat's
    schedule name tasks too. A name that matches no task would be lost at the broker."""
    from celery import current_app
    from django.conf import settings

    from actions import background

    named = {background.RUN_STEP, background.DISPATCH, background.DELIVER_NOTIFICATIONS}
    named |= set(settings.CELERY_TASK_ROUTES)
    named |= {str(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert named - set(current_app.tasks) == set()
