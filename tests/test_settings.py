"""Deployment settings come from the environment; a bad value stops the process at start,
naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def start_with(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY")
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True
    )


SSO_CLIENT = {"GRUNDLAG_OIDC_CLIENT_ID": "grundlag", "GRUNDLAG_OIDC_CLIENT_SECRET": "s3cret"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORKER_CONCURRENCY": "lots"}, "WORKER_CONCURRENCY must be an integer, got 'lots'"),
        ({"WORKER_CONCURRENCY": "0"}, "WORKER_CONCURRENCY must be at least 1, got 0"),
        ({"DEBUG": "maybe"}, "DEBUG must be a boolean"),
        (
            {"GRUNDLAG_VAR_DIR": "/proc/no-such-place"},
            "GRUNDLAG_VAR_DIR (/proc/no-such-place) cannot be made private",
        ),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL must be a redis:// URL"),
        ({"DATABASE_URL": "nosuchdb://x"}, "DATABASE_URL is not a valid database URL"),
        ({"GRUNDLAG_MODELS": "{not json"}, "GRUNDLAG_MODELS must be JSON"),
        (
            {"GRUNDLAG_OIDC_ISSUER": "https://idp.example.com"},
            "GRUNDLAG_OIDC_ISSUER needs GRUNDLAG_OIDC_CLIENT_ID",
        ),
        (
            {"GRUNDLAG_OIDC_ISSUER": "http://idp.example.com", **SSO_CLIENT},
            "GRUNDLAG_OIDC_ISSUER must be an https:// URL",
        ),
        (
            {
                "GRUNDLAG_OIDC_ISSUER": "https://idp.example.com",
                "GRUNDLAG_OIDC_SCOPES": "email",
                **SSO_CLIENT,
            },
            "GRUNDLAG_OIDC_SCOPES must include openid",
        ),
        ({"GRUNDLAG_PASSWORD_LOGIN": "false"}, "GRUNDLAG_PASSWORD_LOGIN=false needs single sign-on"),
        (
            {"DATABASE_URL": "postgres://u:p@127.0.0.1:1/x", "DB_CONN_MAX_AGE": "60"},
            "with the connection pool (DB_POOL_SIZE) it must be 0",
        ),
    ],
)
@pytest.mark.slow  # starts the settings in a process of their own
def test_a_bad_setting_stops_the_process_naming_the_variable(env: dict[str, str], message: str) -> None:
    result = start_with(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


@pytest.mark.slow  # starts the settings in a process of their own
def test_the_defaults_run_on_one_machine() -> None:
    result = start_with()
    assert result.returncode == 0, result.stderr


def settings_of(var_dir: Path, *names: str, **env: str) -> list[str]:
    code = "from django.conf import settings as s; " + "; ".join(f"print('=', s.{name})" for name in names)
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DEBUG", "SECRET_KEY", "PORT", "GRUNDLAG_BASE_URL")
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT, env={**clean, "GRUNDLAG_VAR_DIR": str(var_dir), **env}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [line[2:] for line in result.stdout.splitlines() if line.startswith("= ")]


@pytest.mark.slow  # starts the settings in a process of their own
def test_by_default_debug_is_off_and_the_servers_files_are_its_own(tmp_path: Path) -> None:
    var = tmp_path / "var"
    debug, key, database = settings_of(var, "DEBUG", "SECRET_KEY", "DATABASES['default']['NAME']")
    assert debug == "False"
    assert len(key) > 50 and "insecure" not in key
    assert settings_of(var, "SECRET_KEY") == [key], "the generated key is kept"
    assert (var.stat().st_mode & 0o777) == 0o700
    assert ((var / "secret_key").stat().st_mode & 0o777) == 0o600
    assert database == str(var / "grundlag.sqlite3")
    assert (Path(database).stat().st_mode & 0o777) == 0o600


@pytest.mark.slow  # starts the settings in a process of their own
def test_links_follow_the_port_make_run_serves_on_unless_the_base_url_is_set(tmp_path: Path) -> None:
    """Mails, webhooks and MCP results linked to port 8000 under `PORT=8170 make run` (issue 36)."""
    var = tmp_path / "var"
    assert settings_of(var, "GRUNDLAG_BASE_URL") == ["http://127.0.0.1:8000"]
    assert settings_of(var, "GRUNDLAG_BASE_URL", PORT="8170") == ["http://127.0.0.1:8170"]
    assert settings_of(
        var, "GRUNDLAG_BASE_URL", PORT="8170", GRUNDLAG_BASE_URL="https://approvals.example.com"
    ) == ["https://approvals.example.com"]


@pytest.mark.slow  # starts the settings in a process of their own
def test_sqlite_connections_take_their_checkpoint_size_from_the_environment(tmp_path: Path) -> None:
    pragma = (
        "from django.db import connection as c; "
        "print(c.cursor().execute('PRAGMA wal_autocheckpoint').fetchone()[0])"
    )
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    for env, pages in (({}, "8000"), ({"SQLITE_WAL_AUTOCHECKPOINT": "2000"}, "2000")):
        result = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", pragma],
            cwd=ROOT, env={**os.environ, "DATABASE_URL": url, **env}, capture_output=True, text=True,
        )  # fmt: skip
        assert result.stdout.strip().splitlines()[-1] == pages, result.stderr


def test_under_asgi_the_middleware_runs_in_one_thread_switching_only_at_its_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each switch between the event loop and a request's thread waits its turn for the
    interpreter on a busy server. The stack switches to the thread as the request comes in and
    back to the loop for the view alone; no middleware in between makes it switch again (Axes'
    own ran in the loop, and switched the stack there for itself and CSPMiddleware)."""
    from asgiref.sync import iscoroutinefunction
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.base import BaseHandler

    adapted: list[tuple[str, str | None]] = []
    adapt = BaseHandler.adapt_method_mode

    def recording(
        self: BaseHandler,
        is_async: bool,
        method: Any,
        method_is_async: bool | None = None,
        debug: bool = False,
        name: str | None = None,
    ) -> Any:
        if is_async != (iscoroutinefunction(method) if method_is_async is None else method_is_async):
            adapted.append(("to the loop" if is_async else "to the thread", name))
        return adapt(self, is_async, method, method_is_async, debug, name)

    monkeypatch.setattr(BaseHandler, "adapt_method_mode", recording)
    ASGIHandler()
    chain = [(way, name) for way, name in adapted if name is not None or way == "to the thread"]
    assert chain == [("to the thread", "middleware actions.web.middleware.AxesMiddleware")]
    assert adapted[-1] == ("to the loop", None), "the whole stack, entered from the loop"


def test_a_stack_that_does_not_end_with_axes_middleware_is_refused_by_a_check(settings: Any) -> None:
    """The site runs a subclass of Axes' middleware, which Axes' own check does not see: the
    site's check is what stops a stack without the lock-out."""
    from django.core import checks

    def errors() -> list[str]:
        return [message.id for message in checks.run_checks(tags=[checks.Tags.security]) if message.id]

    assert "grundlag.E001" not in errors()
    settings.MIDDLEWARE = settings.MIDDLEWARE[:-1]
    assert "grundlag.E001" in errors()
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "axes.middleware.AxesMiddleware"]
    assert "grundlag.E001" not in errors()  # Axes' own will do


def test_a_thread_sending_a_task_shares_the_one_result_backend_stand_in() -> None:
    """Every API request runs in a thread of its own and sends its run's step: a backend made
    per thread scanned every installed package's entry points first (10 % of a web process's
    time under bench/isolation.py)."""
    import threading

    from grundlag_site.celery import app

    backend = app.backend
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(app.backend))
    thread.start()
    thread.join()
    assert seen == [backend]


@pytest.mark.slow  # starts the settings in a process of their own
def test_a_requests_unhandled_error_reaches_the_log_without_debug() -> None:
    """DEBUG off (deployed): Django's own console handler is silent, yet a request's traceback
    (`django.request`) and the servers' warnings must reach stderr."""
    clean = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DATABASE_URL", "REDIS_URL")}
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "import logging; logging.getLogger('django.request').error('Internal Server Error: /boom-42')",
        ],
        cwd=ROOT,
        env={**clean, "DEBUG": "false", "SECRET_KEY": "x" * 50},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("Internal Server Error: /boom-42") == 1, result.stderr


@pytest.mark.slow  # starts a process of its own
def test_a_web_process_without_a_worker_needs_a_broker() -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    result = subprocess.run(
        [sys.executable, "manage.py", "serve", "--no-worker", "--port", "1"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "--no-worker needs REDIS_URL" in result.stderr
