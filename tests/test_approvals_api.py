"""The approvals API (a service outside asks the team), Idempotency-Key on every POST, and the
paged lists of runs and interrupts: over HTTP, in-process, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from actions import engine
from actions.engine import grants, idempotency
from actions.models import IdempotencyKey, Interrupt, Policy, Run, RunEvent, Team, TeamRule, Webhook
from tests.conftest import member
from tests.test_api import Api

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]

TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "window": {"type": "string", "enum": ["tonight", "weekend"]},
        "ticket": {"type": "string", "minLength": 3},
        "notify": {"type": "boolean"},
    },
    "required": ["window", "ticket"],
}


@pytest.fixture
def api(client: Client, token_key: str) -> Api:
    return Api(client, token_key)


@pytest.fixture
def other_api(other_token_key: str) -> Api:
    return Api(Client(), other_token_key)


def as_person(user: User) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def ask(api: Api, wait: int | None = None, **fields: Any) -> Any:
    body = {"message": "Deploy v2.3 to production?", "data": {"service": "billing", "version": "2.3"}}
    return api.post("/approvals", {**body, **fields}, wait=wait)


def the_interrupt(approval_id: int) -> Interrupt:
    return Interrupt.objects.get(run_id=approval_id)


# Asking, and the answer


def test_an_approval_waits_in_the_inbox_and_its_answer_fits_the_schema(api: Api, reviewer: User) -> None:
    asked = ask(api, answer_schema=TICKET_SCHEMA)
    assert asked.status_code == 202
    approval = asked.json()
    assert approval["status"] == "pending" and approval["answer"] is None
    assert approval["url"] == f"http://testserver/runs/{approval['id']}/"
    run = Run.objects.get(pk=approval["id"])
    assert (run.consumer, run.action, run.status) == ("approval", "approval", "interrupted")

    # In the team's inbox, with a form made from the schema.
    browser = as_person(reviewer)
    assert "Deploy v2.3 to production?" in browser.get("/").content.decode()
    it = the_interrupt(approval["id"])
    page = browser.get(f"/interrupts/{it.pk}/").content.decode()
    assert 'name="answer-window"' in page and 'name="answer-ticket"' in page

    # An answer that does not fit is refused on its field, and decides nothing.
    refused = browser.post(
        f"/interrupts/{it.pk}/approve/", {"answer-window": "tonight", "answer-ticket": "x"}
    )
    assert refused.status_code == 422
    assert "at least 3 characters" in refused.content.decode()
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "pending"

    browser.post(f"/interrupts/{it.pk}/approve/", {"answer-window": "weekend", "answer-ticket": "CHG-7"})
    decided = api.get(f"/approvals/{approval['id']}")
    assert decided.status_code == 200
    body = decided.json()
    assert body["status"] == "approved"
    assert body["answer"] == {"window": "weekend", "ticket": "CHG-7", "notify": False}
    assert body["decided_by"] == "reviewer1" and body["decided_at"] is not None


def test_the_question_is_in_the_inbox_when_the_request_that_asks_returns(api: Api, settings: Any) -> None:
    """POST /api/approvals answered pending before its interrupt existed (a worker's step
    recorded it later), with no interrupt id (issue 36). Its step runs none of the caller's
    code: it is recorded in the request, whatever workers there are (here: none that run)."""
    from concurrent.futures import Future

    from actions.engine import queue

    class NoWorkers:
        handed: list[Any] = []

        def submit(self, *args: Any, **kwargs: Any) -> Future[None]:
            self.handed.append(args)
            return Future()

    settings.GRUNDLAG_INLINE_STEPS = False
    workers = NoWorkers()
    queue.run_steps_in(workers)  # type: ignore[arg-type]
    try:
        asked = ask(api)
    finally:
        queue.run_steps_in(None)
    assert asked.status_code == 202, asked.content
    body = asked.json()
    assert body["status"] == "pending" and body["interrupt_id"] is not None
    listed = api.get("/interrupts?status=pending").json()["items"]
    assert [item["id"] for item in listed] == [body["interrupt_id"]]
    assert workers.handed == []  # nothing waited for a worker


def test_the_schemas_text_is_shown_as_text_never_as_markup(api: Api, reviewer: User) -> None:
    injected = '<span hx-post="approve/" hx-trigger="load" hx-vals=\'{"answer-ticket": "pwned"}\'>x</span>'
    schema = {
        "type": "object",
        "properties": {"ticket": {"type": "string", "title": "<b>Ticket</b>", "description": injected}},
    }
    approval = ask(api, answer_schema=schema).json()
    it = the_interrupt(approval["id"])
    page = as_person(reviewer).get(f"/interrupts/{it.pk}/").content.decode()
    assert '<span hx-post="approve/"' not in page and "<b>Ticket</b>" not in page
    assert "&lt;span hx-post=" in page and "&lt;b&gt;Ticket&lt;/b&gt;" in page
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "pending"


def test_a_boolean_choice_is_answered_as_chosen(api: Api, reviewer: User) -> None:
    schema = {
        "type": "object",
        "properties": {"to_production": {"enum": [False, True]}},
        "required": ["to_production"],
    }
    approval = ask(api, answer_schema=schema).json()
    it = the_interrupt(approval["id"])
    as_person(reviewer).post(f"/interrupts/{it.pk}/approve/", {"answer-to_production": "false"})
    assert api.get(f"/approvals/{approval['id']}").json()["answer"] == {"to_production": False}


def test_an_absurd_wait_is_no_wait(api: Api) -> None:
    approval = ask(api).json()
    response = api.client.get(
        f"/api/approvals/{approval['id']}",
        headers={"Authorization": f"Bearer {api.key}", "Prefer": "wait=" + "9" * 5000},
    )
    assert response.status_code == 200 and response.json()["status"] == "pending"


def test_an_answer_over_the_api_is_checked_against_the_schema(
    api: Api, team: Team, reviewer: User, token_key: str
) -> None:
    approval = ask(api, answer_schema=TICKET_SCHEMA).json()
    it = the_interrupt(approval["id"])
    with pytest.raises(engine.InvalidAnswer) as refused:
        engine.resume(it, {"window": "someday", "ticket": "CHG-8"}, reviewer)
    assert refused.value.errors[0]["loc"] == ["window"]
    assert "is not one of" in refused.value.errors[0]["msg"]
    engine.resume(it, {"window": "tonight", "ticket": "CHG-8"}, reviewer)
    assert api.get(f"/approvals/{approval['id']}").json()["answer"] == {
        "window": "tonight",
        "ticket": "CHG-8",
    }


def test_without_a_schema_the_answer_is_a_plain_approval(api: Api, reviewer: User) -> None:
    approval = ask(api).json()
    it = the_interrupt(approval["id"])
    as_person(reviewer).post(f"/interrupts/{it.pk}/approve/", {"answer-comment": "go"})
    assert api.get(f"/approvals/{approval['id']}").json()["answer"] == {"approved": True, "comment": "go"}


def test_the_token_that_asks_may_not_answer_its_own_approval(api: Api) -> None:
    approval = ask(api).json()
    it = the_interrupt(approval["id"])
    refused = api.post(f"/interrupts/{it.pk}/resume", {"data": {"approved": True}})
    assert refused.status_code == 403
    assert "Separation of duties" in refused.json()["detail"]
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "pending"


def test_a_rejection_ends_it_rejected_with_the_reason(api: Api, reviewer: User) -> None:
    approval = ask(api).json()
    it = the_interrupt(approval["id"])
    as_person(reviewer).post(f"/interrupts/{it.pk}/reject/", {"reject-reason": "not during the freeze"})
    body = api.get(f"/approvals/{approval['id']}").json()
    assert body["status"] == "rejected" and body["reason"] == "not during the freeze"
    assert body["answer"] is None and body["decided_by"] == "reviewer1"


@pytest.mark.django_db(transaction=True)  # concurrent requests on threads: each must see the other's commits
def test_prefer_wait_on_read_returns_as_soon_as_it_is_decided(api: Api, reviewer: User) -> None:
    approval = ask(api).json()
    it = the_interrupt(approval["id"])

    def decide_soon() -> None:
        try:
            time.sleep(0.3)
            engine.resume(it, {"approved": True, "comment": ""}, reviewer)
        finally:
            connection.close()

    thread = threading.Thread(target=decide_soon)
    began = time.monotonic()
    thread.start()
    response = api.client.get(
        f"/api/approvals/{approval['id']}",
        headers={"Authorization": f"Bearer {api.key}", "Prefer": "wait=10"},
    )
    thread.join(10)
    assert response.status_code == 200 and response.json()["status"] == "approved"
    assert time.monotonic() - began < 8


def test_a_pending_approval_is_cancelled_once(api: Api, reviewer: User) -> None:
    approval = ask(api).json()
    cancelled = api.post(f"/approvals/{approval['id']}/cancel", {})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert the_interrupt(approval["id"]).status == Interrupt.Status.CANCELLED
    again = api.post(f"/approvals/{approval['id']}/cancel", {})
    assert again.status_code == 409


def test_another_teams_token_sees_no_approval(api: Api, other_api: Api) -> None:
    approval = ask(api).json()
    assert other_api.get(f"/approvals/{approval['id']}").status_code == 404
    assert other_api.post(f"/approvals/{approval['id']}/cancel", {}).status_code == 404
    # Nor is a run of another kind an approval.
    run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}).json()
    assert api.get(f"/approvals/{run['id']}").status_code == 404


def test_the_caller_hears_of_the_decision_by_the_run_finished_webhook(
    api: Api, reviewer: User, receiver: Any
) -> None:
    from actions import notify

    hook = api.post("/webhooks", {"url": receiver.url, "events": ["run.finished"]}).json()
    approval = ask(api, answer_schema=TICKET_SCHEMA).json()
    engine.resume(the_interrupt(approval["id"]), {"window": "tonight", "ticket": "CHG-9"}, reviewer)
    notify.dispatch()
    (finished,) = receiver.verified(hook["secret"])
    assert finished["type"] == "run.finished"
    assert finished["data"]["id"] == approval["id"] and finished["data"]["consumer"] == "approval"
    assert finished["data"]["output"] == {"window": "tonight", "ticket": "CHG-9"}


# Its policy


def test_a_deadline_applies_the_default_answer(api: Api) -> None:
    approval = ask(
        api,
        answer_schema=TICKET_SCHEMA,
        deadline_seconds=600,
        default_answer={"window": "weekend", "ticket": "AUTO"},
    ).json()
    assert approval["expires_at"] is not None
    engine.apply_policies(timezone.now() + timedelta(seconds=601))
    body = api.get(f"/approvals/{approval['id']}").json()
    assert body["status"] == "approved" and body["answer"] == {"window": "weekend", "ticket": "AUTO"}
    assert body["decided_via"] == "deadline" and body["decided_by"] == "deadline policy"


def test_a_deadline_without_a_default_expires_it(api: Api) -> None:
    approval = ask(api, deadline_seconds=60).json()
    engine.apply_policies(timezone.now() + timedelta(seconds=61))
    body = api.get(f"/approvals/{approval['id']}").json()
    assert body["status"] == "expired" and "expired" in body["reason"]


def test_approvals_required_asks_more_people_never_fewer_than_the_team(
    api: Api, team: Team, reviewer: User, second_reviewer: User
) -> None:
    approval = ask(api, approvals_required=2).json()
    assert approval["approvals_required"] == 2
    it = the_interrupt(approval["id"])
    engine.resume(it, {"approved": True, "comment": ""}, reviewer)
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "pending"
    engine.resume(Interrupt.objects.get(pk=it.pk), {"approved": True, "comment": ""}, second_reviewer)
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "approved"

    Policy.objects.create(team=team, action="approval", approvals_required=3)
    assert ask(api, approvals_required=1).json()["approvals_required"] == 3


def test_assignees_alone_may_decide(api: Api, team: Team, reviewer: User, second_reviewer: User) -> None:
    approval = ask(api, assignees=["reviewer2"]).json()
    it = the_interrupt(approval["id"])
    with pytest.raises(engine.NotAllowed):
        engine.resume(it, {"approved": True, "comment": ""}, reviewer)
    engine.resume(it, {"approved": True, "comment": ""}, second_reviewer)
    assert api.get(f"/approvals/{approval['id']}").json()["decided_by"] == "reviewer2"


def test_the_teams_rules_decide_approvals_too(api: Api, team: Team) -> None:
    TeamRule.objects.create(
        team=team,
        name="small refunds",
        action="approval",
        when="data.amount < 100",
        then=TeamRule.Then.APPROVE,
        answer={"approved": True, "comment": "small"},
    )
    small = ask(api, data={"amount": 20}).json()
    big = ask(api, data={"amount": 2000}).json()
    assert api.get(f"/approvals/{small['id']}").json()["status"] == "approved"
    assert api.get(f"/approvals/{small['id']}").json()["decided_by"] == "rule: small refunds"
    assert api.get(f"/approvals/{small['id']}").json()["decided_via"] == "rule"
    assert api.get(f"/approvals/{big['id']}").json()["status"] == "pending"


def test_what_the_request_asks_adds_to_the_teams_policy_never_takes_from_it(
    api: Api, team: Team, reviewer: User, second_reviewer: User
) -> None:
    Policy.objects.create(team=team, action="approval", assignees="reviewer1", deadline_minutes=10)
    outside = ask(api, assignees=["reviewer2"])
    assert outside.status_code == 422 and "only reviewer1" in outside.json()["message"]
    own_default = ask(api, deadline_seconds=600, default_answer={"approved": True, "comment": ""})
    assert own_default.status_code == 422 and "what happens at the deadline" in own_default.json()["message"]
    assert not Run.objects.exists()
    # A deadline later than the team's is the team's.
    later = ask(api, deadline_seconds=3600).json()
    expires = Interrupt.objects.get(run_id=later["id"]).expires_at
    assert expires is not None and expires - timezone.now() < timedelta(minutes=11)
    assert later["assignees"] == ["reviewer1"]


@pytest.mark.parametrize(
    "rule",
    [
        {"then": TeamRule.Then.REQUIRE, "approvals": 2},
        {"then": TeamRule.Then.ASSIGN, "assignees": "reviewer1"},
    ],
    ids=["require-2", "assign"],
)
def test_a_default_answer_never_outlives_a_rule_that_asks_for_named_or_more_people(
    api: Api, team: Team, rule: dict[str, Any]
) -> None:
    """The README promises a default answer only where one approval by anyone would do: at the
    deadline it was approved by "deadline policy", no person (issue 36). Now it expires."""
    TeamRule.objects.create(team=team, name="big", action="approval", when="data.amount > 1000.0", **rule)
    big = ask(
        api, data={"amount": 5000.0}, deadline_seconds=600, default_answer={"approved": True, "comment": ""}
    ).json()
    small = ask(
        api, data={"amount": 10.0}, deadline_seconds=600, default_answer={"approved": True, "comment": ""}
    ).json()
    it = the_interrupt(big["id"])
    assert it.default_answer is None
    created = RunEvent.objects.get(interrupt=it, kind=RunEvent.Kind.INTERRUPTED).detail
    assert created["default_answer_dropped"].startswith("no default answer at the deadline: ")
    engine.apply_policies(timezone.now() + timedelta(seconds=601))
    assert api.get(f"/approvals/{big['id']}").json()["status"] == "expired"
    assert api.get(f"/approvals/{small['id']}").json()["status"] == "approved"  # one by anyone would do


def test_routing_keeps_what_was_asked(api: Api, team: Team, other_team: Team, outsider: User) -> None:
    """A route rule to payroll turned a request for 2 approvals into 1: payroll1 approved it
    alone (issue 36). The routed interrupt keeps the count, and the earlier deadline."""
    second_outsider = member(other_team, "payroll2")
    TeamRule.objects.create(
        team=team, name="to payroll", action="approval", when="true", then="route", route_to=other_team
    )
    approval = ask(api, approvals_required=2, deadline_seconds=600).json()
    it = the_interrupt(approval["id"])
    assert it.team_ids == [other_team.pk] and it.approvals_required == 2
    assert it.expires_at is not None and it.expires_at - timezone.now() < timedelta(seconds=601)
    engine.resume(it, {"approved": True, "comment": ""}, outsider)
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "pending"
    engine.resume(Interrupt.objects.get(pk=it.pk), {"approved": True, "comment": ""}, second_outsider)
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "approved"


def test_routing_carries_a_default_answer_only_where_the_other_team_would_allow_one(
    api: Api, team: Team, other_team: Team
) -> None:
    """A team whose own deadline expires its approvals must not have them approved by another
    team's requester's default (review of issue 36)."""
    Policy.objects.create(team=other_team, action="approval", deadline_minutes=5)
    TeamRule.objects.create(
        team=team, name="to payroll", action="approval", when="true", then="route", route_to=other_team
    )
    approval = ask(api, deadline_seconds=600, default_answer={"approved": True, "comment": ""}).json()
    it = the_interrupt(approval["id"])
    assert it.team_ids == [other_team.pk] and it.default_answer is None
    created = RunEvent.objects.get(interrupt=it, kind=RunEvent.Kind.INTERRUPTED).detail
    assert created["default_answer_dropped"] == "no default answer at the deadline: payroll allows none"
    engine.apply_policies(timezone.now() + timedelta(minutes=6))
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "expired"


def test_a_rules_answer_must_fit_the_schema_or_people_decide(api: Api, team: Team) -> None:
    TeamRule.objects.create(
        team=team, name="wave it through", action="approval", when="true",
        then=TeamRule.Then.APPROVE, answer={"approved": True},
    )  # fmt: skip
    approval = ask(api, answer_schema=TICKET_SCHEMA).json()
    assert api.get(f"/approvals/{approval['id']}").json()["status"] == "pending"
    event = RunEvent.objects.get(run_id=approval["id"], kind=RunEvent.Kind.INTERRUPTED)
    assert "does not fit" in event.detail["rule_failed"]["error"]


def test_a_standing_grant_covers_the_same_question_only(api: Api, team: Team, reviewer: User) -> None:

    first = ask(api, data={"service": "billing"}).json()
    it = the_interrupt(first["id"])
    grants.give_grant(it, reviewer, lasting="hour", answer={"approved": True, "comment": ""})
    engine.resume(it, {"approved": True, "comment": ""}, reviewer)
    same = ask(api, data={"service": "billing"}).json()
    other_question = ask(api, message="Drop the billing database?", data={"service": "billing"}).json()
    assert api.get(f"/approvals/{same['id']}").json()["decided_via"] == "grant"
    assert api.get(f"/approvals/{other_question['id']}").json()["status"] == "pending"


@pytest.mark.parametrize("condition", ["", "data.service == 'billing'"], ids=["plain", "with-condition"])
def test_a_grant_on_a_services_question_covers_that_question_only_condition_or_not(
    api: Api, team: Team, reviewer: User, condition: str
) -> None:
    """With a condition, a grant given on one question approved other questions from the same
    token; the README says "the same question only" (issue 36). The question is its message,
    data and answer schema; a condition narrows it further, never widens it."""

    first = ask(api, data={"service": "billing"}).json()
    it = the_interrupt(first["id"])
    approve = {"approved": True, "comment": ""}
    grants.give_grant(it, reviewer, lasting="hour", condition=condition, answer=approve)
    engine.resume(it, {"approved": True, "comment": ""}, reviewer)
    same = ask(api, data={"service": "billing"}).json()
    others = [
        ask(api, message="Drop the billing database?", data={"service": "billing"}).json(),
        ask(api, data={"service": "billing", "version": "9"}).json(),
        ask(api, data={"service": "billing"}, answer_schema=TICKET_SCHEMA).json(),
    ]
    assert api.get(f"/approvals/{same['id']}").json()["decided_via"] == "grant"
    assert [api.get(f"/approvals/{o['id']}").json()["status"] for o in others] == ["pending"] * 3


def test_one_failing_deadline_does_not_stop_the_others(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from actions.engine import deadlines

    broken = ask(api, deadline_seconds=60).json()
    fine = ask(api, deadline_seconds=60).json()
    apply = deadlines._apply_deadline

    def failing(interrupt: Interrupt) -> None:
        if interrupt.run_id == broken["id"]:
            raise RuntimeError("a defect")
        apply(interrupt)

    monkeypatch.setattr(deadlines, "_apply_deadline", failing)
    engine.apply_policies(timezone.now() + timedelta(seconds=61))
    assert api.get(f"/approvals/{fine['id']}").json()["status"] == "expired"
    assert api.get(f"/approvals/{broken['id']}").json()["status"] == "pending"


# Bad requests: a clear error, and nothing created


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"answer_schema": {"type": "object", "properties": {"n": {"type": "integr"}}}}, "answer_schema"),
        ({"answer_schema": {"type": "string"}}, "answer_schema"),
        ({"default_answer": {"window": "tonight"}}, "default_answer"),
        (
            {"answer_schema": TICKET_SCHEMA, "deadline_seconds": 600, "default_answer": {"window": "never"}},
            "default_answer",
        ),
        ({"assignees": ["nobody"]}, "assignees"),
        ({"approvals_required": 0}, "approvals_required"),
        ({"deadline_seconds": 0}, "deadline_seconds"),
        ({"colour": "red"}, "colour"),
        ({"message": "   "}, "message"),
        # What a form cannot show, or what would run long or reach elsewhere:
        (
            {
                "answer_schema": {
                    "type": "object",
                    "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}},
                }
            },
            "pattern",
        ),
        (
            {"answer_schema": {"type": "object", "patternProperties": {"^x": {"type": "string"}}}},
            "patternProperties",
        ),
        ({"answer_schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}}, "$ref"),
        (
            {
                "answer_schema": {
                    "type": "object",
                    "properties": {"a": {"$ref": "https://example.com/s.json"}},
                }
            },
            "$ref",
        ),
        ({"answer_schema": {"type": "object", "properties": {"a": True}}}, "true or false schema"),
        (
            {"answer_schema": {"type": "object", "properties": {"a": {"anyOf": [True, {"type": "string"}]}}}},
            "anyOf",
        ),
        ({"answer_schema": {"type": "object", "properties": {"a": {"enum": []}}}}, "enum"),
        ({"answer_schema": {"type": "object", "properties": {"a": {"enum": ["x", 1]}}}}, "enum"),
        ({"answer_schema": {"type": "object", "properties": {"a": {"enum": [{"x": 1}]}}}}, "enum"),
        ({"answer_schema": {"type": "object", "description": "x" * 20_000}}, "16384"),
        ({"approvals_required": 3, "assignees": ["reviewer1"]}, "approvals_required"),
        (
            {"approvals_required": 2, "deadline_seconds": 600, "default_answer": {"ok": True}},
            "default_answer",
        ),
        ({"deadline_seconds": 1, "default_answer": {"approved": True}}, "deadline_seconds"),
        (
            {
                "answer_schema": {
                    "type": "object",
                    "properties": {"a": {"type": "array", "uniqueItems": True}},
                }
            },
            "uniqueItems",
        ),
        (
            {
                "answer_schema": {
                    "type": "object",
                    "properties": {
                        "a": {
                            "not": {
                                "not": {
                                    "not": {
                                        "not": {
                                            "not": {
                                                "not": {
                                                    "not": {
                                                        "not": {
                                                            "not": {
                                                                "not": {
                                                                    "not": {
                                                                        "not": {
                                                                            "not": {
                                                                                "not": {"not": {"not": {}}}
                                                                            }
                                                                        }
                                                                    }
                                                                }
                                                            }
                                                        }
                                                    }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    },
                }
            },
            "nested",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_the_field_and_creates_nothing(
    api: Api, reviewer: User, fields: dict[str, Any], where: str
) -> None:
    refused = ask(api, **fields)
    assert refused.status_code == 422, refused.content
    assert where in json.dumps(refused.json()["detail"])
    assert not Run.objects.exists()


# Idempotency-Key


def post(api: Api, path: str, body: Any, key: str, wait: int | None = None) -> Any:
    headers = {"Authorization": f"Bearer {api.key}", "Idempotency-Key": key}
    if wait is not None:
        headers["Prefer"] = f"wait={wait}"
    return api.client.post(f"/api{path}", json.dumps(body), content_type="application/json", headers=headers)


def at_once(send: Any, times: int = 2) -> list[Any]:
    """What ``send()`` answers, called from ``times`` threads at the same moment."""
    barrier = threading.Barrier(times)
    answers: list[Any] = []

    def sender() -> None:
        try:
            barrier.wait()
            answers.append(send())
        finally:
            connection.close()

    threads = [threading.Thread(target=sender) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_a_retry_with_the_same_key_replays_the_first_answer(api: Api) -> None:
    body = {"action": "send_invoice", "input": {"invoice_id": "A-1", "amount": 10}}
    first = post(api, "/runs", body, "k-1")
    again = post(api, "/runs", body, "k-1")
    assert again.status_code == first.status_code
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Run.objects.count() == 1
    # The key is the token's: another key, or none, starts another run.
    post(api, "/runs", body, "k-2")
    api.post("/runs", body)
    assert Run.objects.count() == 3


def test_the_same_key_with_another_body_is_refused(api: Api) -> None:
    post(api, "/approvals", {"message": "one?"}, "k")
    refused = post(api, "/approvals", {"message": "two?"}, "k")
    assert refused.status_code == 422
    assert "another request" in refused.json()["detail"]
    assert post(api, "/runs", {"action": "send_invoice", "input": {}}, "k").status_code == 422
    assert Run.objects.count() == 1


def test_a_decision_retried_is_made_once(api: Api, requester_approves: None) -> None:
    run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}).json()
    path = f"/interrupts/{run['interrupt']['id']}/resume"
    first = post(api, path, {"data": {"approved": True}}, "decide-1")
    again = post(api, path, {"data": {"approved": True}}, "decide-1")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert RunEvent.objects.filter(run_id=run["id"], kind=RunEvent.Kind.APPROVED).count() == 1
    # Without the key, the second is told it was decided already.
    assert api.post(path, {"data": {"approved": True}}).status_code == 409


@pytest.fixture
def requester_approves(team: Team) -> None:
    Policy.objects.create(team=team, action="send_invoice", requester_may_approve=True)


@pytest.mark.django_db(transaction=True)  # concurrent requests on threads: each must see the other's commits
def test_a_decision_retried_while_the_first_is_made_gets_its_answer_not_already_decided(
    api: Api, token_key: str, requester_approves: None
) -> None:
    run = api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}).json()
    path = f"/interrupts/{run['interrupt']['id']}/resume"
    answers = at_once(
        lambda: post(Api(Client(), token_key), path, {"data": {"approved": True}}, "decide-race")
    )
    for answer in answers:
        if answer.status_code == 409:  # the first was still being answered: retry, and get it
            assert answer["Retry-After"] == "1", answer.json()
        else:
            assert answer.status_code == 200 and answer.json()["status"] == "completed"
    assert RunEvent.objects.filter(run_id=run["id"], kind=RunEvent.Kind.APPROVED).count() == 1
    retried = post(api, path, {"data": {"approved": True}}, "decide-race")
    assert retried.status_code == 200 and retried["Idempotent-Replayed"] == "true"


def test_a_request_that_changed_nothing_keeps_no_key(api: Api) -> None:
    refused = post(api, "/runs", {"action": "send_invoice", "input": {"amount": "lots"}}, "k")
    assert refused.status_code == 422
    assert not IdempotencyKey.objects.exists()
    # Corrected, under the same key, it runs.
    ok = post(api, "/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}, "k-fixed")
    assert ok.status_code == 200
    assert post(api, "/runs/999999/cancel", {}, "k-missing").status_code == 404
    assert IdempotencyKey.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # concurrent requests on threads: each must see the other's commits
def test_two_requests_with_one_key_at_once_make_one_change(api: Api, token_key: str) -> None:
    answers = at_once(lambda: post(Api(Client(), token_key), "/approvals", {"message": "once?"}, "race"))
    assert Run.objects.count() == 1
    codes = sorted(answer.status_code for answer in answers)
    assert codes[0] == 202 and codes[1] in (202, 409)
    if codes[1] == 409:
        assert "being answered" in next(a for a in answers if a.status_code == 409).json()["detail"]
    # Afterwards, a retry gets the first answer.
    retried = post(api, "/approvals", {"message": "once?"}, "race")
    assert retried["Idempotent-Replayed"] == "true" and retried.json()["id"] == Run.objects.get().pk


def test_a_key_whose_request_was_never_answered_says_what_it_did(api: Api, settings: Any) -> None:
    # The first request made its change, and its process stopped before answering.
    first = post(api, "/approvals", {"message": "lost?"}, "k")
    row = IdempotencyKey.objects.get()
    IdempotencyKey.objects.filter(pk=row.pk).update(status_code=None, response=None)
    busy = post(api, "/approvals", {"message": "lost?"}, "k")
    assert busy.status_code == 409 and busy["Retry-After"] == "1"
    IdempotencyKey.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(hours=2))
    lost = post(api, "/approvals", {"message": "lost?"}, "k")
    assert lost.status_code == 409 and lost.json()["run_id"] == first.json()["id"]
    assert Run.objects.count() == 1


def test_every_post_of_the_api_takes_a_key(api: Api, team: Team, settings: Any) -> None:
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["run.finished"]}
    first = post(api, "/webhooks", hook, "hook-1")
    again = post(api, "/webhooks", hook, "hook-1")
    assert first.status_code == again.status_code == 201 and again.json() == first.json()
    assert Webhook.objects.count() == 1
    script = post(api, "/scripts/runs", {"source": "return 1"}, "s-1")
    agent = post(
        api,
        "/agents/runs",
        {"messages": [{"role": "user", "content": "hi"}], "model": {"scripted": []}},
        "a-1",
    )
    for response, path, body in (
        (script, "/scripts/runs", {"source": "return 1"}),
        (agent, "/agents/runs", {"messages": [{"role": "user", "content": "hi"}], "model": {"scripted": []}}),
    ):
        if response.status_code < 300:
            key = "s-1" if path.startswith("/scripts") else "a-1"
            assert post(api, path, body, key).json() == response.json()
    runs = Run.objects.count()
    approval = ask(api).json()
    cancel = post(api, f"/approvals/{approval['id']}/cancel", {}, "c-1")
    assert post(api, f"/approvals/{approval['id']}/cancel", {}, "c-1").json() == cancel.json()
    assert Run.objects.count() == runs + 1


def test_a_bad_key_is_refused(api: Api) -> None:
    for bad in ("", "x" * 256, "naïve"):
        response = api.client.post(
            "/api/approvals",
            json.dumps({"message": "?"}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {api.key}", "Idempotency-Key": bad},
        )
        assert response.status_code == 400, bad
        assert "Idempotency-Key" in response.json()["detail"]
    assert not Run.objects.exists()


def test_keys_are_kept_a_day(api: Api) -> None:
    post(api, "/approvals", {"message": "?"}, "old")
    post(api, "/approvals", {"message": "?"}, "new")
    IdempotencyKey.objects.filter(key="old").update(created_at=timezone.now() - timedelta(hours=25))
    assert idempotency.prune() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


# Lists


def test_runs_are_listed_filtered_and_paged_by_cursor(api: Api, other_api: Api) -> None:
    for n in range(7):
        api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": f"A-{n}", "amount": n + 1}})
    ask(api)
    other_api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "B", "amount": 1}})

    seen: list[int] = []
    after = ""
    while True:
        page = api.get(f"/runs?limit=3&action=send_invoice&after={after}").json()
        assert len(page["items"]) <= 3
        seen += [item["id"] for item in page["items"]]
        after = page["next"]
        if not after:
            break
    mine = list(Run.objects.filter(action="send_invoice", team__slug="finance").values_list("pk", flat=True))
    assert seen == sorted(mine, reverse=True)

    approvals = api.get("/runs?consumer=approval").json()["items"]
    assert [item["action"] for item in approvals] == ["approval"]
    assert api.get("/runs?status=interrupted").json()["items"][0]["status"] == "interrupted"
    assert api.get("/runs?status=completed").json()["items"] == []
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert (
        api.client.get("/api/runs", {"since": future}, headers={"Authorization": f"Bearer {api.key}"}).json()[
            "items"
        ]
        == []
    )
    assert len(api.client.get(
        "/api/runs", {"until": future}, headers={"Authorization": f"Bearer {api.key}"}
    ).json()["items"]) == 8  # fmt: skip


def test_interrupts_are_listed_filtered_and_paged_by_cursor(api: Api, team: Team) -> None:
    for n in range(4):
        ask(api, data={"n": n})
    api.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}})
    first = api.get("/interrupts?status=pending&action=approval&limit=3").json()
    second = api.get(f"/interrupts?status=pending&action=approval&limit=3&after={first['next']}").json()
    assert [it["data"]["n"] for it in first["items"] + second["items"]] == [3, 2, 1, 0]
    assert second["next"] == ""
    assert all("state" not in it for it in first["items"])
    assert [it["action"] for it in api.get("/interrupts?consumer=api").json()["items"]] == ["send_invoice"]


@pytest.mark.parametrize(
    "query", ["after=garbage", "status=lost", "consumer=robot", "limit=0", "limit=501", "since=yesterday"]
)
def test_a_bad_list_query_is_refused(api: Api, query: str) -> None:
    for path in ("/runs", "/interrupts"):
        response = api.get(f"{path}?{query}")
        assert response.status_code == 422, (path, query)
        assert response.json()["detail"]


def test_a_teammate_is_no_assignee_of_another_team(api: Api, other_team: Team) -> None:
    member(other_team, "payroll1")
    refused = ask(api, assignees=["payroll1"])
    assert refused.status_code == 422 and "payroll1" in json.dumps(refused.json())


def test_the_contract_is_settled_once_logged_by_layer_and_shown_in_the_api_and_on_the_page(
    api: Api, team: Team, reviewer: User
) -> None:
    """The team's policy (separation of duties), the request (a deadline, a default answer) and
    a rule (two approvals) each add to what deciding it requires, and the contract's last word
    drops the default answer (two people must approve). The event says which layer changed
    what; the API and the decision page say the result."""
    Policy.objects.create(team=team, action="approval", requester_may_approve=False)
    TeamRule.objects.create(
        team=team, name="big ones", action="approval", when="data.amount > 1000.0",
        then=TeamRule.Then.REQUIRE, approvals=2,
    )  # fmt: skip
    approval = ask(
        api, data={"amount": 5000.0}, deadline_seconds=900, default_answer={"approved": True}
    ).json()
    it = the_interrupt(approval["id"])
    event = RunEvent.objects.get(interrupt=it, kind="interrupted")
    layers: dict[str, Any] = {layer["layer"]: layer["changed"] for layer in event.detail["contract"]}
    assert list(layers) == ["team policy", "request", "rule: big ones", "contract"]
    assert layers["team policy"] == {"requester_may_approve": False}
    assert layers["request"] == {"deadline_seconds": 900, "default_answer": {"approved": True}}
    assert layers["rule: big ones"] == {"approvals": 2}
    assert layers["contract"] == {"default_answer": None}

    (listed,) = api.get("/interrupts?status=pending").json()["items"]
    requires = listed["requires"]
    assert requires == api.get(f"/runs/{approval['id']}").json()["interrupt"]["requires"]
    assert {k: v for k, v in requires.items() if k != "deadline"} == {
        "team": "finance", "approvals": 2, "assignees": [], "requester_may_approve": False,
        "at_deadline": "expires", "escalate_to": None, "escalate_at": None,
    }  # fmt: skip
    deadline = datetime.fromisoformat(requires["deadline"].replace("Z", "+00:00"))
    assert it.expires_at is not None and abs(deadline - it.expires_at) < timedelta(milliseconds=1)

    page = as_person(reviewer).get(f"/interrupts/{it.pk}/").content.decode()
    assert (
        "2 different people approving the same answer" in page and "any approver or admin of the team" in page
    )
    assert "may not approve it (separation of duties)" in page
    assert "then it expires and the run fails" in page
    assert "<strong>team policy</strong>: requester may approve: no" in page
    assert "<strong>rule: big ones</strong>: approvals: 2" in page
    assert "<strong>contract</strong>: default answer: none" in page


def test_a_routed_interrupts_contract_tells_the_asking_team_nothing_of_the_other_teams_people(
    api: Api, other_api: Api, team: Team, other_team: Team
) -> None:
    member(other_team, "payroll9")
    Policy.objects.create(team=other_team, action="approval", assignees="payroll9")
    TeamRule.objects.create(
        team=team, name="to payroll", action="approval", when="true",
        then=TeamRule.Then.ROUTE, route_to=other_team,
    )  # fmt: skip
    approval = ask(api).json()
    asked = api.get(f"/runs/{approval['id']}").json()["interrupt"]["requires"]
    assert (asked["team"], asked["assignees"], asked["escalate_to"]) == ("payroll", [], None)
    (theirs,) = other_api.get("/interrupts?status=pending").json()["items"]
    assert theirs["requires"]["assignees"] == ["payroll9"]
