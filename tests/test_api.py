"""The HTTP API, in-process: its shape, its errors and its team scoping."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from actions import engine
from actions.models import ApiToken, Interrupt, Policy, Run, Team, hash_token

# Runs with steps in workers and inline (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps")]


class Api:
    def __init__(self, client: Client, key: str) -> None:
        self.client, self.key = client, key

    def _headers(self, wait: int | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.key}"}
        if wait is not None:
            headers["Prefer"] = f"wait={wait}"
        return headers

    def get(self, path: str) -> Any:
        return self.client.get(f"/api{path}", headers=self._headers(None))

    def post(self, path: str, body: Any, wait: int | None = 5) -> Any:
        return self.client.post(
            f"/api{path}", json.dumps(body), content_type="application/json", headers=self._headers(wait)
        )


@pytest.fixture
def requester_approves(team: Team) -> None:
    """The team lets a caller answer the runs it started, of the demo actions that separate duties."""
    for name in ("transfer_funds", "delete_customer_data"):
        Policy.objects.create(team=team, action=name, requester_may_approve=True)


@pytest.fixture
def api(client: Client, token_key: str) -> Api:
    return Api(client, token_key)


@pytest.fixture
def other_api(client: Client, other_token_key: str) -> Api:
    return Api(client, other_token_key)


def test_actions_are_listed_with_input_and_answer_schemas(api: Api) -> None:
    response = api.get("/actions")
    assert response.status_code == 200
    actions = {a["name"]: a for a in response.json()}
    assert {"send_invoice", "transfer_funds", "delete_customer_data", "await_payment"} <= set(actions)
    assert actions["send_invoice"]["input_schema"]["required"] == ["invoice_id", "amount"]
    assert actions["send_invoice"]["answer_schema"] is None
    assert "ticket" in actions["delete_customer_data"]["answer_schema"]["properties"]


def test_a_query_parameter_the_operation_does_not_take_is_refused_naming_it(api: Api) -> None:
    """A misspelt filter (?statuss=pending) listed everything; a parameter of no operation was
    ignored (issue 36): each is refused, with what the operation does take left to its own
    checks, and a refused POST starts nothing."""
    assert api.get("/runs?status=completed&limit=5").status_code == 200
    refused = api.get("/runs?statuss=pending&limit=5")
    assert refused.status_code == 422
    assert refused.json()["detail"] == [
        {"loc": ["query", "statuss"], "msg": "not a parameter of this operation", "type": "extra"}
    ]
    assert api.get("/actions?x=1").status_code == 422  # an operation that takes none
    started = api.post("/runs?debug=1", {"action": "noted", "input": {"text": "x"}})
    assert started.status_code == 422 and started.json()["detail"][0]["loc"] == ["query", "debug"]
    assert not Run.objects.exists()
    document = api.client.get("/api/openapi.json").json()
    assert "422" in document["paths"]["/api/actions"]["get"]["responses"]


def test_a_run_is_answered_over_http_and_completes(api: Api) -> None:
    started = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A-1", "amount": 10}})
    assert started.status_code == 200
    body = started.json()
    assert body["status"] == "interrupted" and body["output"] is None
    interrupt = body["interrupt"]
    assert interrupt["message"] == "Approve sending the invoice?"
    assert interrupt["data"] == {"invoice_id": "A-1", "amount": 10.0}
    assert interrupt["resume_url"] == f"http://testserver/api/interrupts/{interrupt['id']}/resume"

    resumed = api.post(f"/interrupts/{interrupt['id']}/resume", {"data": {"approved": True}})
    assert resumed.status_code == 200
    assert resumed.json()["status"] == "completed"
    assert resumed.json()["output"]["approved_by_answer"] == {"approved": True}
    assert resumed.json()["interrupt"] is None


def test_a_paused_runs_description_reads_the_run_and_its_interrupt_in_one_query_each(
    api: Api, django_assert_num_queries: Any
) -> None:
    """What a waiting request reads once its run has paused, on the API's critical path: the
    interrupt's columns that the answer tells, in one query (a column it tells that was not
    read would cost one more), and for a finished run no interrupt query at all."""
    from django.test import RequestFactory

    from actions.api import responses as endpoints

    started = api.post(
        "/runs", {"action": "send_invoice", "input": {"invoice_id": "Q-1", "amount": 3}}
    ).json()
    request = RequestFactory().get("/")
    # As the API's auth sets it: the token, with its team.
    request.auth = ApiToken.objects.select_related("team").get()  # type: ignore[attr-defined]
    run = Run.objects.get(pk=started["id"])
    with django_assert_num_queries(1):
        described = endpoints.run_out(request, run)
    assert described["interrupt"] == started["interrupt"]
    assert described["interrupt"]["message"] == "Approve sending the invoice?"
    api.post(f"/interrupts/{started['interrupt']['id']}/resume", {"data": {"approved": True}})
    run = Run.objects.get(pk=started["id"])
    with django_assert_num_queries(0):
        assert endpoints.run_out(request, run)["interrupt"] is None


def test_a_requests_lookups_of_one_row_sort_nothing(api: Api) -> None:
    """The token every request checks, and the interrupt a resume names, are one row or none:
    read without the models' ORDER BY (the token's, by team name, joined the team to sort one
    row, and compiling it was a third of the query's cost on every request)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    started = api.post(
        "/runs", {"action": "send_invoice", "input": {"invoice_id": "Q-2", "amount": 3}}
    ).json()
    with CaptureQueriesContext(connection) as queries:
        resumed = api.post(f"/interrupts/{started['interrupt']['id']}/resume", {"data": {"approved": True}})
    assert resumed.status_code == 200 and resumed.json()["status"] == "completed"
    lookups = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    token = [sql for sql in lookups if 'FROM "actions_apitoken"' in sql]
    interrupt = [
        sql
        for sql in lookups
        if 'FROM "actions_interrupt"' in sql
        and ('"actions_interrupt"."id" =' in sql or 'WHERE "id" =' in sql)
    ]
    assert token and interrupt
    assert not [sql for sql in token + interrupt if "ORDER BY" in sql]
    assert api.post("/interrupts/999999/resume", {"data": {}}).status_code == 404
    assert Api(api.client, "gl_not-a-token").get("/runs/1").status_code == 401


def test_the_run_has_its_transcript_in_order(api: Api, requester_approves: None) -> None:
    run = api.post("/runs", {"action": "transfer_funds", "input": {"amount": 2000, "to": "X"}}).json()
    second = api.post(f"/interrupts/{run['interrupt']['id']}/resume", {"data": {"approved": True}}).json()
    api.post(f"/interrupts/{second['interrupt']['id']}/reject", {"reason": "limit exceeded"})
    detail = api.get(f"/runs/{run['id']}").json()
    assert detail["status"] == "rejected" and detail["error"] == "limit exceeded"
    assert [(t["seq"], t["status"], t["decided_by"]) for t in detail["transcript"]] == [
        (1, "approved", "API token ci"),
        (2, "rejected", "API token ci"),
    ]
    assert detail["transcript"][0]["answer"] == {"approved": True}
    assert detail["transcript"][1]["reason"] == "limit exceeded"


def test_a_rejection_says_why_as_reason_and_the_earlier_error_is_still_read(api: Api) -> None:
    """The body field is ``reason``, as every response calls it (issue 36); ``error``, its first
    name, still works (reason wins where both are sent); neither, or an empty one, is a 422 naming
    it, and decides nothing."""

    def pending() -> tuple[str, int]:
        run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "R", "amount": 1}}).json()
        return f"/interrupts/{run['interrupt']['id']}", run["id"]

    url, run_id = pending()
    for body in ({}, {"reason": ""}, {"error": ""}, {"why": "x"}):
        refused = api.post(f"{url}/reject", body)
        assert refused.status_code == 422, (body, refused.content)
    assert "reason" in str(api.post(f"{url}/reject", {}).json()["detail"])
    assert api.get(f"/runs/{run_id}").json()["status"] == "interrupted"
    assert api.post(f"{url}/reject", {"reason": "over budget"}).json()["status"] == "rejected"
    url, run_id = pending()
    assert api.post(f"{url}/reject", {"error": "as before"}).json()["status"] == "rejected"
    assert api.get(f"/runs/{run_id}").json()["transcript"][-1]["reason"] == "as before"
    url, run_id = pending()
    assert api.post(f"{url}/reject", {"reason": "new", "error": "old"}).json()["status"] == "rejected"
    assert api.get(f"/runs/{run_id}").json()["transcript"][-1]["reason"] == "new"


def test_since_and_until_are_date_times_not_numbers(api: Api) -> None:
    """`?since=0.5` was 200: pydantic read a number as seconds since 1970 (issue 36)."""
    api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "S", "amount": 1}})
    for path in ("/runs", "/interrupts"):
        for query in ("since=0.5", "until=1700000000", "since=yesterday"):
            refused = api.get(f"{path}?{query}")
            assert refused.status_code == 422, (path, query, refused.content)
            assert "ISO 8601" in json.dumps(refused.json()), refused.content
        assert len(api.get(f"{path}?since=2000-01-01T00:00:00Z").json()["items"]) == 1
        assert api.get(f"{path}?until=2000-01-01").json()["items"] == []


def test_a_second_decision_is_409_naming_who_decided(api: Api) -> None:
    run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}).json()
    url = f"/interrupts/{run['interrupt']['id']}"
    assert api.post(f"{url}/reject", {"reason": "no"}).status_code == 200
    again = api.post(f"{url}/resume", {"data": {"approved": True}})
    assert again.status_code == 409
    assert again.json()["detail"].startswith("already rejected by API token ci at ")
    assert again.json()["decided_by"] == "API token ci"


def test_an_answer_that_does_not_fit_is_422_with_field_errors_and_changes_nothing(
    api: Api, requester_approves: None
) -> None:
    run = api.post("/runs", {"action": "delete_customer_data", "input": {"customer_id": "c"}}).json()
    url = f"/interrupts/{run['interrupt']['id']}/resume"
    response = api.post(url, {"data": {"confirm_customer_id": "c"}})
    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["detail"]] == [["ticket"]]
    assert api.get(f"/runs/{run['id']}").json()["status"] == "interrupted"
    assert (
        api.post(url, {"data": {"confirm_customer_id": "c", "ticket": "T-1"}}).json()["status"] == "completed"
    )


def test_unknown_action_is_404_and_invalid_input_is_422(api: Api) -> None:
    unknown = api.post("/runs", {"action": "launch_rockets", "input": {}})
    assert unknown.status_code == 404 and "launch_rockets" in unknown.json()["detail"]
    invalid = api.post("/runs", {"action": "send_invoice", "input": {"amount": "lots"}})
    assert invalid.status_code == 422
    assert {tuple(e["loc"]) for e in invalid.json()["detail"]} == {("invoice_id",), ("amount",)}
    malformed = api.client.post(
        "/api/runs",
        "{not json",
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert malformed.status_code in (400, 422) and "detail" in malformed.json()
    assert not Run.objects.exists()


def test_without_a_valid_token_everything_is_401(client: Client, api: Api, team: Team) -> None:
    assert client.get("/api/actions").status_code == 401
    assert Api(client, "gl_wrong").get("/actions").status_code == 401
    token = ApiToken.objects.get(team=team)
    token.revoke()
    response = api.get("/actions")
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    assert "missing, unknown, revoked or expired" in response.json()["detail"]


def test_a_request_notes_when_its_token_was_last_used_at_most_once_a_minute(api: Api, team: Team) -> None:
    token = ApiToken.objects.get(team=team)
    assert token.last_used_at is None
    assert api.get("/actions").status_code == 200
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    assert api.get("/actions").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == first, "not written again within the minute"
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    assert api.get("/actions").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at > first - timedelta(minutes=1)


def test_another_teams_runs_and_interrupts_are_404(api: Api, other_api: Api) -> None:
    run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}).json()
    interrupt_id = run["interrupt"]["id"]
    assert other_api.get(f"/runs/{run['id']}").status_code == 404
    assert other_api.post(f"/interrupts/{interrupt_id}/resume", {"data": {}}).status_code == 404
    assert other_api.post(f"/interrupts/{interrupt_id}/reject", {"error": "x"}).status_code == 404
    assert other_api.get("/interrupts?status=pending").json()["items"] == []
    assert [i["id"] for i in api.get("/interrupts?status=pending").json()["items"]] == [interrupt_id]
    # Escalated to the other team (its deadline passed), it is theirs to see and decide too;
    # due to escalate but not yet escalated, it is not.
    other_team = ApiToken.objects.get(key_hash=hash_token(other_api.key)).team
    Interrupt.objects.filter(pk=interrupt_id).update(escalate_to=other_team)
    assert other_api.post(f"/interrupts/{interrupt_id}/reject", {"reason": "x"}).status_code == 404
    Interrupt.objects.filter(pk=interrupt_id).update(escalated_at=timezone.now())
    # Its contract, as the run's own team reads it, names both teams (no query left deferred).
    paused = api.get(f"/runs/{run['id']}").json()["interrupt"]["requires"]
    assert (paused["team"], paused["escalate_to"]) == ("finance", other_team.slug)
    rejected = other_api.post(f"/interrupts/{interrupt_id}/reject", {"reason": "not ours"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    assert other_api.get(f"/runs/{run['id']}").status_code == 404, "the run stays its own team's"


def test_an_id_no_row_can_have_is_404_not_an_error(api: Api) -> None:
    huge = 2**64
    assert api.get(f"/runs/{huge}").status_code == 404
    assert api.post(f"/interrupts/{huge}/resume", {"data": {}}).status_code == 404
    assert api.post(f"/interrupts/{huge}/reject", {"reason": "x"}).status_code == 404


def test_the_bearer_header_is_read_alike_by_the_api_and_mcp(api: Api, client: Client) -> None:
    # A key with a space after it, as some clients send it: accepted by every entry point.
    assert client.get("/api/actions", headers={"Authorization": f"Bearer {api.key} "}).status_code == 200
    assert client.get("/api/actions", headers={"Authorization": f"bearer {api.key}"}).status_code == 200
    for header in ("Bearer", "Bearer ", f"Basic {api.key}", api.key):
        assert client.get("/api/actions", headers={"Authorization": header}).status_code == 401, header


def test_without_prefer_wait_the_response_does_not_wait(api: Api) -> None:
    # Steps run inline in this test process, so the run is settled either way; the point is the shape.
    response = api.post(
        "/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}, wait=None
    )
    assert response.status_code in (200, 202)
    assert set(response.json()) == {"id", "action", "consumer", "status", "output", "error", "interrupt"}


def test_state_never_appears_in_any_response(api: Api, requester_approves: None) -> None:
    run = api.post("/runs", {"action": "transfer_funds", "input": {"amount": 5000, "to": "X"}}).json()
    second = api.post(f"/interrupts/{run['interrupt']['id']}/resume", {"data": {"marker": "SECRET-FIRST"}})
    # The first answer is now the second interrupt's private checkpoint.
    second_id = second.json()["interrupt"]["id"]
    from actions.models import Interrupt

    assert Interrupt.objects.get(pk=second_id).state == {"first_answer": {"marker": "SECRET-FIRST"}}
    bodies = [
        second.content,
        api.get(f"/runs/{run['id']}").content,
        api.get("/interrupts").content,
        api.get("/interrupts?status=pending").content,
        api.client.get("/api/openapi.json").content,
    ]
    for body in bodies:
        assert b"first_answer" not in body
        assert b'"state"' not in body


def test_openapi_and_docs_are_served(client: Client) -> None:
    schema = client.get("/api/openapi.json").json()
    assert {"/api/runs", "/api/interrupts/{interrupt_id}/resume", "/api/actions"} <= set(schema["paths"])
    assert client.get("/api/docs").status_code == 200
    # What the API refuses is in the document (issue 36): the key's characters, a webhook's URL,
    # a missing token, a request that does not fit.
    parameters = schema["paths"]["/api/runs"]["post"]["parameters"]
    key = next(p for p in parameters if p["name"] == "Idempotency-Key")
    assert key["schema"]["pattern"] == "^[ -~]+$"
    assert schema["components"]["schemas"]["WebhookIn"]["properties"]["url"]["pattern"].startswith("^[Hh]")
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert "401" in operation["responses"], (method, path)


def test_create_api_token_prints_the_key_alone_on_the_last_line(team: Team, capsys: Any) -> None:
    call_command("create_api_token", "finance", "--name", "deploy-bot")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert key.startswith("gl_")
    token = engine.authenticate(key)
    assert token is not None and token.name == "deploy-bot" and token.team == team
    assert key not in str(ApiToken.objects.values_list()), "only the hash is stored"


def test_unknown_paths_and_methods_get_json_errors(api: Api) -> None:
    missing = api.get("/nothing-here")
    assert missing.status_code == 404 and missing.json()["detail"]
    wrong = api.client.delete("/api/actions", headers={"Authorization": f"Bearer {api.key}"})
    assert wrong.status_code == 405 and wrong.json() == {"detail": "Method not allowed"}


def test_a_run_is_cancelled_through_the_api_and_its_interrupt_leaves_the_inbox(
    api: Api, other_api: Api
) -> None:
    run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "C-1", "amount": 2}}).json()
    assert run["status"] == "interrupted"
    assert other_api.post(f"/runs/{run['id']}/cancel", {}).status_code == 404, "another team's run"
    Run.objects.filter(pk=run["id"]).update(status="running")  # as while a worker runs its step
    running = api.post(f"/runs/{run['id']}/cancel", {})
    assert running.status_code == 409 and "running a step" in running.json()["detail"]
    Run.objects.filter(pk=run["id"]).update(status="interrupted")

    cancelled = api.post(f"/runs/{run['id']}/cancel", {})
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["interrupt"] is None
    transcript = api.get(f"/runs/{run['id']}").json()["transcript"]
    assert [entry["status"] for entry in transcript] == ["cancelled"]
    assert api.get("/interrupts?status=pending").json()["items"] == []

    again = api.post(f"/runs/{run['id']}/cancel", {})
    assert again.status_code == 409 and again.json()["detail"] == f"run {run['id']} is already cancelled"
    late = api.post(f"/interrupts/{run['interrupt']['id']}/resume", {"data": {"approved": True}})
    assert late.status_code == 409 and late.json()["status"] == "cancelled"
