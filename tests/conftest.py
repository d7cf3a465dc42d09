from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from actions.models import ApiToken, Team
from grundlag_site.celery import app as celery_app


@pytest.fixture(autouse=True, scope="session")
def _tasks_run_inline() -> None:
    """In this process, steps run inline where they are enqueued (after commit), so engine
    and API tests see a settled run. Tests under tests/integration run real worker processes."""
    celery_app.conf.task_always_eager = True


@pytest.fixture
def team(db: Any) -> Team:
    return Team.objects.create(name="Finance", slug="finance")


@pytest.fixture
def other_team(db: Any) -> Team:
    return Team.objects.create(name="Payroll", slug="payroll")


@pytest.fixture
def reviewer(team: Team) -> User:
    user = User.objects.create_user("reviewer1", password="pw-reviewer1")
    team.members.add(user)
    return user


@pytest.fixture
def requester(team: Team) -> User:
    """A member of the team who starts runs (and, where the policy separates duties, may not
    approve them)."""
    user = User.objects.create_user("requester1", password="pw-requester1")
    team.members.add(user)
    return user


@pytest.fixture
def second_reviewer(team: Team) -> User:
    user = User.objects.create_user("reviewer2", password="pw-reviewer2")
    team.members.add(user)
    return user


@pytest.fixture
def outsider(other_team: Team) -> User:
    """A reviewer of another team."""
    user = User.objects.create_user("payroll1", password="pw-payroll1")
    other_team.members.add(user)
    return user


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
