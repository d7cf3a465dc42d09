"""The drivers' and the HTTP layers' tests, run again with inline steps (GRUNDLAG_INLINE_STEPS):
there a start or a decision claims the step in its own transaction and runs it after commit, in
the caller's process. tests/test_engine.py runs its own tests in both modes already."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.processes import pytest_passes

pytestmark = pytest.mark.integration

MODULES = [
    "tests/test_agent.py",
    "tests/test_sandbox.py",
    "tests/test_policies.py",
    "tests/test_api.py",
    "tests/test_dashboard.py",
]


def test_the_drivers_and_the_api_pass_with_inline_steps(tmp_path: Path) -> None:
    pytest_passes(MODULES, GRUNDLAG_INLINE_STEPS="true", TEST_SQLITE_NAME=str(tmp_path / "inline.sqlite3"))
