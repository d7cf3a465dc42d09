"""The layout's promises, checked on the source: every state change of a run or an interrupt is
in actions/engine, and every SQL statement written by hand is in actions/engine/store.py."""

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


def _status_writes(tree: ast.AST) -> list[int]:
    """Lines that write a status: `x.status = ...`, or an update()/create() given one."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr in STATUS_FIELDS for t in targets):
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and any(keyword.arg in STATUS_FIELDS for keyword in node.keywords)
        ):
            lines.append(node.lineno)
    return sorted(lines)


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
        "Run.objects.filter(pk=1).update(status='failed')\nit.status = 'approved'\nok = it.status"
    )
    assert _status_writes(written) == [1, 2]


@pytest.mark.parametrize("statement", SQL)
def test_sql_is_written_only_in_the_engines_store(statement: str) -> None:
    store = ACTIONS / "engine" / "store.py"
    holders = [
        str(path.relative_to(ACTIONS.parent))
        for path in _sources(outside="engine/store.py")
        if re.search(statement, path.read_text()) and path != store
    ]
    assert holders == []
