"""The engine's own tests, run again on PostgreSQL: its hot path is SQL (actions/store.py), and
row locks, RETURNING and JSON columns behave differently there than on SQLite."""

from __future__ import annotations

import pytest

from tests.integration.processes import pytest_passes
from tests.integration.services import Postgres

pytestmark = pytest.mark.integration

MODULES = [
    "tests/test_store.py",
    "tests/test_engine.py",
    "tests/test_policies.py",
    "tests/test_agent.py",
    "tests/test_integrity.py",
]


def test_the_engine_tests_pass_on_postgresql(postgres: Postgres) -> None:
    # pytest-django creates (and drops) test_<name> next to this database.
    pytest_passes(MODULES, DATABASE_URL=postgres.create_database("engine_tests"))
