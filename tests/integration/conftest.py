from __future__ import annotations

import itertools
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from grundlag_client import Client
from tests.integration.processes import Server, Site, base_env
from tests.integration.services import Postgres, Redis

TEST_ACTIONS = "actions.examples,tests.integration.effects"
SIDE_EFFECTS_TABLE = "CREATE TABLE test_side_effects (id SERIAL PRIMARY KEY, effect_key TEXT NOT NULL)"
_databases = itertools.count(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _finish(site: Site, request: pytest.FixtureRequest) -> None:
    site.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(site.logs())


def _seed(site: Site) -> str:
    site.manage("migrate", "--noinput", "-v0")
    return site.manage("seed_demo", "--no-runs").strip().splitlines()[-1].split(": ")[-1]


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A migrated, seeded SQLite file (team demo, its reviewers, an API token) to copy per test."""
    path = tmp_path_factory.mktemp("template") / "template.sqlite3"
    site = Site(env=base_env(f"sqlite:///{path}", action_modules=TEST_ACTIONS), log_dir=path.parent)
    token = _seed(site)
    db = sqlite3.connect(path)
    with db:
        db.execute(SIDE_EFFECTS_TABLE.replace("SERIAL", "INTEGER"))
    # Fold the write-ahead log into the file, so that copying the one file copies everything.
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    return path, token


@pytest.fixture
def site(tmp_path: Path, request: pytest.FixtureRequest, sqlite_template: tuple[Path, str]) -> Iterator[Site]:
    """The app on a SQLite file of its own (the embedded setup); every process it starts is
    stopped afterwards."""
    template, token = sqlite_template
    shutil.copy(template, tmp_path / "site.sqlite3")
    site = Site(
        env=base_env(f"sqlite:///{tmp_path / 'site.sqlite3'}", action_modules=TEST_ACTIONS),
        log_dir=tmp_path,
        token=token,
    )
    yield site
    _finish(site, request)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Redis]:
    server = Redis()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_template(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = postgres.create_database("grundlag_template")
    site = Site(
        env=base_env(url, action_modules=TEST_ACTIONS), log_dir=tmp_path_factory.mktemp("pg-template")
    )
    token = _seed(site)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SIDE_EFFECTS_TABLE)
    return token


@pytest.fixture
def scaled_site(
    postgres: Postgres,
    redis_server: Redis,
    postgres_template: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Site]:
    """The scaled setup: PostgreSQL, Redis as broker and channel layer, and whatever daphne
    and worker processes the test starts."""
    if redis_server.proc is None:
        redis_server.start()
    redis_server.flush()
    if postgres.proc is None:
        postgres.start()
    url = postgres.create_database(f"grundlag_{next(_databases)}", template="grundlag_template")
    env = base_env(url, action_modules=TEST_ACTIONS)
    env.update(REDIS_URL=redis_server.url, GRUNDLAG_STEP_LEASE_SECONDS="6", STEP_VISIBILITY_TIMEOUT="8")
    site = Site(env=env, log_dir=tmp_path, token=postgres_template)
    site.postgres, site.redis = postgres, redis_server
    yield site
    _finish(site, request)


@pytest.fixture
def web(site: Site) -> Server:
    """`make run`'s server (`manage.py serve`) on the site's SQLite file."""
    return site.serve()


@pytest.fixture
def grundlag(web: Server, site: Site) -> Iterator[Client]:
    """The Python client (clients/python) on ``web``, with the demo team's token."""
    with Client(web.url, site.token, timeout=10) as api:
        yield api
