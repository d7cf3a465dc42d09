"""The drivers' and the HTTP layers' tests, run again with inline steps (GRUNDLAG_INLINE_STEPS):
there a start or a decision claims the step in its own transaction and runs it after commit, in
the caller's process. tests/test_engine.py runs its own tests in both modes already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "tests/test_agent.py",
    "tests/test_sandbox.py",
    "tests/test_policies.py",
    "tests/test_api.py",
    "tests/test_dashboard.py",
]


def test_the_drivers_and_the_api_pass_with_inline_steps(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GRUNDLAG_INLINE_STEPS": "true",
        "DJANGO_SETTINGS_MODULE": "grundlag_site.settings",
        "TEST_SQLITE_NAME": str(tmp_path / "inline.sqlite3"),
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
