"""The engine's own tests, run again on PostgreSQL: its hot path is SQL (actions/store.py), and
row locks, RETURNING and JSON columns behave differently there than on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.services import Postgres

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/test_store.py", "tests/test_engine.py", "tests/test_policies.py", "tests/test_agent.py"]


def test_the_engine_tests_pass_on_postgresql(postgres: Postgres) -> None:
    env = {
        **os.environ,
        # pytest-django creates (and drops) test_<name> next to this database.
        "DATABASE_URL": postgres.create_database("engine_tests"),
        "DJANGO_SETTINGS_MODULE": "grundlag_site.settings",
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout
