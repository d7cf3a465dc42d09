"""What every benchmark shares: production settings (DEBUG off records no queries), on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "benchmark-only-secret-key-not-for-any-deployment-0123456789",
    # Plain HTTP on 127.0.0.1: cookies must not demand HTTPS here.
    "SECURE_COOKIES": "false",
}


def migrated_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's child process, its database migrated."""
    env = {
        **os.environ,
        **PRODUCTION_ENV,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "grundlag_site.settings",
        **extra,
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True
    )
    return env
