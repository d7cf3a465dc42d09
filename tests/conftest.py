"""Fixtures for every test (each in a transaction rolled back at its end, its after-commit work
run as deployed: tests/commits.py), and the two variants the engine's and drivers' tests run in.

- ``steps``: "worker steps" (handed to Celery, here eager, which claims them) or "inline steps"
  (GRUNDLAG_INLINE_STEPS: claimed by the transaction that queues them, run after it commits).
- ``database``: "sqlite" or "postgresql": the engine's hot path is SQL (actions/engine/store.py),
  and row locks, RETURNING and JSON columns behave differently on each. The PostgreSQL variant
  runs on a real server the session starts (tests/integration/services.py).

A module opts in with ``pytest.mark.usefixtures("steps", "database")``; ``pytest --collect-only``
lists each test once per variant, e.g. ``test_x[worker-postgresql]``. Without PostgreSQL
installed its variant fails, saying so (`.ci/run` installs it). GRUNDLAG_TEST_DATABASES and
GRUNDLAG_TEST_STEPS pick the variants (both of each by default; `make check` runs the worker
steps on SQLite).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, connections

from actions.models import ApiToken, Team
from grundlag_site.celery import run_tasks_where_sent
from tests import commits, recorded
from tests.webhook_receiver import Receiver


@pytest.fixture(autouse=True, scope="session")
def _tasks_run_inline() -> None:
    """In this process, steps run inline where they are enqueued (after commit), so engine
    and API tests see a settled run. Tests under tests/integration run real worker processes."""
    run_tasks_where_sent()


@pytest.fixture(autouse=True, scope="session")
def _commits_as_deployed() -> None:
    """In a test that rolls back, the code's after-commit work runs when its own outermost
    block exits, as deployed (tests/commits.py)."""
    commits.install()


# The variants


@pytest.fixture(autouse=True)
def _quick_password_hashes(request: pytest.FixtureRequest, settings: Any) -> None:
    """A password hashed as deployed (PBKDF2, a million rounds) takes a quarter of a second:
    the tests that make a few users each spent most of their time there. Tests in this process
    hash with MD5; those that start servers (tests/integration), whose processes check the
    passwords too, keep the deployed hasher."""
    if "integration" not in request.node.path.parts:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _variants(name: str, default: str, allowed: set[str]) -> list[str]:
    chosen = [each.strip() for each in os.environ.get(name, default).split(",") if each.strip()]
    if not chosen or set(chosen) - allowed:
        raise pytest.UsageError(f"{name} is a list of {' and '.join(sorted(allowed))}, e.g. {default!r}")
    return chosen


STEPS_UNDER_TEST = _variants("GRUNDLAG_TEST_STEPS", "worker,inline", {"worker", "inline"})


@pytest.fixture(params=STEPS_UNDER_TEST)
def steps(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.GRUNDLAG_INLINE_STEPS = request.param == "inline"
    return str(request.param)


POSTGRESQL = "postgresql"  # the database alias of the PostgreSQL variant
DATABASES_UNDER_TEST = _variants("GRUNDLAG_TEST_DATABASES", "sqlite,postgresql", {"sqlite", POSTGRESQL})
_postgresql: dict[str, Any] = {}  # the session's server, or why it could not start


def _on_postgresql(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("database") == POSTGRESQL


def _start_postgresql(config: pytest.Config) -> None:
    """Start the session's PostgreSQL and add its alias to the settings, before pytest-django
    creates the test databases; or note why it could not, for the variant's tests to say."""
    from tests.integration.services import Postgres, postgres_installed

    if not postgres_installed():
        _postgresql["problem"] = "PostgreSQL is not installed (.ci/run installs it)"
        return
    server = Postgres()
    try:
        server.init()
        server.start()
    except Exception as exc:  # noqa: BLE001 - said by every test of the variant
        server.cleanup()
        _postgresql["problem"] = f"PostgreSQL did not start: {exc}"
        return
    config.add_cleanup(server.cleanup)
    _postgresql["server"] = server
    django_settings.DATABASES[POSTGRESQL] = {
        "ENGINE": "grundlag_site.db.postgresql",
        "NAME": "grundlag",
        "USER": server.user,
        "HOST": "127.0.0.1",
        "PORT": str(server.port),
        "TEST": {"NAME": "test_grundlag"},
        # As settings.py connects to PostgreSQL: parameters bound by the server, statements prepared.
        "OPTIONS": dict(django_settings.POSTGRESQL_STATEMENT_OPTIONS),
    }
    connections.settings[POSTGRESQL] = connections.configure_settings(django_settings.DATABASES)[POSTGRESQL]


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what will not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The PostgreSQL variant's tests may use its database (pytest-django creates a test
    database for every alias a collected test asks for). A server that cannot start fails
    only those tests."""
    if POSTGRESQL not in DATABASES_UNDER_TEST:
        # Without PostgreSQL under test, what needs its server (LISTEN/NOTIFY, the scaled
        # setup) is not collected either.
        needs = [
            item for item in items if _on_postgresql(item) or "postgres" in getattr(item, "fixturenames", ())
        ]
        if needs:
            config.hook.pytest_deselected(items=needs)
            items[:] = [item for item in items if item not in needs]
    variant = [item for item in items if _on_postgresql(item)]
    if not variant or config.option.collectonly:
        return
    _start_postgresql(config)
    if "server" not in _postgresql:
        return  # the database fixture says why, for each of them
    for item in variant:
        marker = item.get_closest_marker("django_db")
        kwargs = dict(marker.kwargs) if marker is not None else {}
        kwargs["databases"] = [DEFAULT_DB_ALIAS, POSTGRESQL]
        # First, so that it is the closest: a test's own django_db marker would be found before it.
        item.add_marker(pytest.mark.django_db(*(marker.args if marker else ()), **kwargs), append=False)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A PostgreSQL server on a private port: the session's, when the variant started one."""
    from tests.integration.services import Postgres

    if "server" in _postgresql:
        yield _postgresql["server"]
        return
    server = Postgres()
    server.init()
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(params=DATABASES_UNDER_TEST)
def database(request: pytest.FixtureRequest) -> Iterator[str]:
    """In the PostgreSQL variant, the default connection (the one the engine, the ORM and
    Django's transactions use) is the PostgreSQL test database's until the test ends: this
    thread's, and that of any thread that opens its first connection during the test (a thread
    that had one already keeps it; the tests' threads are short-lived and close theirs)."""
    if request.param != POSTGRESQL:
        yield str(request.param)
        return
    if "server" not in _postgresql:
        # Never skipped: `make test` needs PostgreSQL (README), as the integration tests do.
        pytest.fail(_postgresql.get("problem", "PostgreSQL was not started"))
    request.getfixturevalue("db")  # the test databases exist, and this test's transaction began
    default, default_settings = connections[DEFAULT_DB_ALIAS], connections.settings[DEFAULT_DB_ALIAS]
    connections[DEFAULT_DB_ALIAS] = connections[POSTGRESQL]
    connections.settings[DEFAULT_DB_ALIAS] = connections.settings[POSTGRESQL]
    try:
        yield POSTGRESQL
    finally:
        from actions.live import waiting

        waiting.stop_listening()  # its connection would keep the test database from being dropped
        connections[DEFAULT_DB_ALIAS] = default
        connections.settings[DEFAULT_DB_ALIAS] = default_settings


# A webhook endpoint on 127.0.0.1 (tests/webhook_receiver.py), allowed as a private address.
@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True  # it listens on 127.0.0.1
    receiver = Receiver()
    yield receiver
    receiver.stop()


# Users and teams


@pytest.fixture
def team(db: Any) -> Team:
    return Team.objects.create(name="Finance", slug="finance")


@pytest.fixture
def other_team(db: Any) -> Team:
    return Team.objects.create(name="Payroll", slug="payroll")


def member(team: Team, username: str) -> User:
    """A user (password ``pw-<username>``) in ``team``."""
    user = User.objects.create_user(username, password=f"pw-{username}")
    team.members.add(user)
    return user


@pytest.fixture
def reviewer(team: Team) -> User:
    return member(team, "reviewer1")


@pytest.fixture
def requester(team: Team) -> User:
    """A member of the team who starts runs (and, where the policy separates duties, may not
    approve them)."""
    return member(team, "requester1")


@pytest.fixture
def second_reviewer(team: Team) -> User:
    return member(team, "reviewer2")


@pytest.fixture
def outsider(other_team: Team) -> User:
    """A reviewer of another team."""
    return member(other_team, "payroll1")


@pytest.fixture
def auditor(db: Any) -> User:
    """A staff user who is a member of no team."""
    return User.objects.create_user("auditor", password="pw-auditor", is_staff=True)


@pytest.fixture
def token_key(team: Team) -> str:
    return ApiToken.issue(team, "ci")[1]


@pytest.fixture
def other_token_key(other_team: Team) -> str:
    return ApiToken.issue(other_team, "payroll-ci")[1]


@pytest.fixture
def ran() -> list[str]:
    """What the test action `noted` (tests/recorded.py) ran for, in order, in this test."""
    recorded.RAN.clear()
    return recorded.RAN
