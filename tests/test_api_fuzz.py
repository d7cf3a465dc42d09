"""Schemathesis against /api/openapi.json: every operation, generated requests (and requests
that break the schema), a bounded number of examples, with Schemathesis's default checks: no
server error, only the status codes, content types, headers and response schemas the document
says, and what breaks the schema refused. And every error is JSON with a `detail`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from actions.models import ApiToken, Team

app = get_wsgi_application()
schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
# What breaks the schema is refused: as Schemathesis expects, or with 413 when it is a body over
# the size cap (documented for every POST).
schema.config.checks.negative_data_rejection.expected_statuses.append("413")


@schemathesis.check
def errors_are_json_with_a_detail(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code < 400:
        return None
    body = json.loads(response.content)
    assert isinstance(body, dict) and body.get("detail"), f"{response.status_code} without a detail: {body}"
    return None


@pytest.fixture
def bearer(transactional_db: Any) -> Iterator[dict[str, str]]:
    team = Team.objects.create(name="Fuzz", slug="fuzz")
    # A generated `Prefer: wait=N` on an approval nobody decides would hold each such example
    # N seconds; the waiting has tests of its own (tests/test_waiting.py), here what matters
    # is the answer's shape, so the operator's cap on a wait is a second.
    with override_settings(GRUNDLAG_MAX_WAIT_SECONDS=1):
        yield {"Authorization": f"Bearer {ApiToken.issue(team, 'fuzz')[1]}"}


@pytest.mark.slow  # make test runs it, make check does not
@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_breaks_the_api(case: Any, bearer: dict[str, str]) -> None:
    # Not "every request the schema allows is accepted": a script's syntax, whether assignees
    # are the team's members, a cursor from another page are not JSON Schema's to say.
    # A case that leaves the Authorization header out (a request breaking the schema: its
    # security scheme requires one) is sent without it, and must be refused (401); any other
    # carries the fuzz team's real token in place of the generated one.
    case.call_and_validate(
        headers=bearer if "Authorization" in (case.headers or {}) else {},
        additional_checks=[errors_are_json_with_a_detail],
        excluded_checks=[positive_data_acceptance],
    )
