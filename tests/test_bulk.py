"""Bulk decisions from the inbox: the preview says what will happen to each, confirming decides
each one apart through the engine, and the result says what did (the race with a colleague in
Chromium is in tests/integration/test_browser.py)."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from actions import engine
from actions.models import Interrupt, Policy, Run, RunEvent, Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps")]


def start(team: Team, action: str = "send_invoice", by: User | None = None, **payload: Any) -> Interrupt:
    payload = payload or {"invoice_id": "INV-9", "amount": 12.5}
    run = engine.start_run(action, payload, team, by, Run.Consumer.DASHBOARD if by else Run.Consumer.API)
    return run.interrupts.get(status="pending")


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def outcome(page: str, interrupt: Interrupt) -> str:
    """The result column of ``interrupt``'s line: its chip and its note, as text."""
    row = re.search(rf'<tr id="bulk-{interrupt.pk}" class="outcome-(\w+)">(.*?)</tr>', page, re.S)
    assert row is not None, f"interrupt {interrupt.pk} is not listed"
    cell = row.group(2).rsplit('<td class="outcome">', 1)[1]
    return row.group(1) + ": " + " ".join(unescape(re.sub(r"<[^>]+>", " ", cell)).split())


def query(verb: str, ids: list[int]) -> dict[str, Any]:
    return {"verb": verb, "ids": ids}


def status(interrupt: Interrupt) -> str:
    interrupt.refresh_from_db()
    return interrupt.status


def test_the_preview_says_what_will_happen_to_each_and_changes_nothing(
    team: Team, reviewer: User, second_reviewer: User, requester: User
) -> None:
    plain = start(team)
    typed = start(team, "delete_customer_data", customer_id="C-1", requested_by="x")
    own = start(team, "transfer_funds", by=reviewer, amount=5.0, to="X")  # separation of duties
    Policy.objects.create(team=team, action="send_invoice", assignees="reviewer2")
    assigned = start(team)
    gone = start(team, "send_invoice", invoice_id="INV-1", amount=1.0)
    engine.reject(gone, "wrong amount", second_reviewer)
    ids = [plain.pk, typed.pk, own.pk, assigned.pk, gone.pk]

    response = logged_in(reviewer).get("/bulk/", query("approve", ids))
    page = response.content.decode()
    assert response.status_code == 200
    assert "Approve 1 of 5 selected?" in page
    assert outcome(page, plain) == "approve: approve"
    assert outcome(page, typed) == "skipped: left out Left out: it needs a typed answer; open it to approve."
    assert outcome(page, own).startswith("refused: not allowed Not allowed: Separation of duties")
    assert outcome(page, assigned) == "refused: not allowed Not allowed: Only reviewer2 may decide this."
    assert outcome(page, gone).startswith("already: already decided Already rejected by reviewer2 at ")
    # Only what will be approved is carried into the confirming form.
    assert re.findall(r'name="ids" value="(\d+)"', page) == [str(plain.pk)]
    assert [status(it) for it in (plain, typed, own, assigned)] == ["pending"] * 4

    reject = logged_in(reviewer).get("/bulk/", query("reject", ids)).content.decode()
    assert "Reject 3 of 5 selected?" in reject, "typed answers and one's own runs may be rejected"
    assert outcome(reject, typed) == "reject: reject" and outcome(reject, own) == "reject: reject"


def test_confirming_decides_each_apart_and_a_colleague_first_is_reported_not_overruled(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    first, second, third = start(team), start(team), start(team)
    client = logged_in(reviewer)
    preview = client.get("/bulk/", query("approve", [first.pk, second.pk, third.pk])).content.decode()
    ids = re.findall(r'name="ids" value="(\d+)"', preview)
    assert sorted(map(int, ids)) == sorted([first.pk, second.pk, third.pk])

    engine.reject(second, "not ours", second_reviewer)  # while the preview is open

    page = client.post("/bulk/", {"verb": "approve", "ids": ids, "comment": "month end"}).content.decode()
    assert "Approved 2 of 3" in page
    assert outcome(page, first) == "approve: approved Approved."
    assert outcome(page, second).startswith(
        "already: already decided Not approved: already rejected by reviewer2"
    )
    assert [status(it) for it in (first, second, third)] == ["approved", "rejected", "approved"]
    first.refresh_from_db()
    assert first.answer == {"approved": True, "comment": "month end"} and first.decided_by == reviewer
    # One decision each, from a bulk decision, and the run went on.
    approved = RunEvent.objects.filter(kind=RunEvent.Kind.APPROVED, run__in=[first.run, third.run])
    assert [e.detail.get("via") for e in approved] == ["bulk", "bulk"]
    assert RunEvent.objects.filter(kind=RunEvent.Kind.APPROVED, run=second.run).count() == 0

    again = client.post("/bulk/", {"verb": "approve", "ids": ids}).content.decode()
    assert "Approved 0 of 3" in again, "confirming twice decides nothing twice"
    assert RunEvent.objects.filter(kind=RunEvent.Kind.APPROVED, run=first.run).count() == 1


def test_a_bulk_approval_is_one_of_the_approvals_an_interrupt_needs(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    Policy.objects.create(team=team, action="send_invoice", approvals_required=2)
    it = start(team)
    page = logged_in(reviewer).post("/bulk/", {"verb": "approve", "ids": [it.pk]}).content.decode()
    assert outcome(page, it) == "approve: approved Approved: 1 of 2 approvals."
    assert status(it) == "pending"
    preview = logged_in(reviewer).get("/bulk/", query("approve", [it.pk])).content.decode()
    assert outcome(preview, it) == "refused: not allowed You approved it already; it needs someone else too."
    page = logged_in(second_reviewer).post("/bulk/", {"verb": "approve", "ids": [it.pk]}).content.decode()
    assert outcome(page, it) == "approve: approved Approved."
    assert status(it) == "approved"


def test_rejecting_needs_a_reason_and_without_one_nothing_is_decided(team: Team, reviewer: User) -> None:
    it = start(team)
    response = logged_in(reviewer).post("/bulk/", {"verb": "reject", "ids": [it.pk], "reason": "  "})
    assert response.status_code == 422
    assert "Say why: each run ends rejected with this reason." in unescape(response.content.decode())
    assert status(it) == "pending"
    page = (
        logged_in(reviewer)
        .post("/bulk/", {"verb": "reject", "ids": [it.pk], "reason": "dupe"})
        .content.decode()
    )
    assert outcome(page, it) == "reject: rejected Rejected."
    it.refresh_from_db()
    assert it.reason == "dupe" and Run.objects.get(pk=it.run_id).status == "rejected"


def test_select_all_previews_what_matches_the_filter_and_confirming_decides_only_what_was_previewed(
    team: Team, other_team: Team, reviewer: User
) -> None:
    other_team.members.add(reviewer)
    invoices = [start(team), start(team)]
    start(team, "transfer_funds", amount=5.0, to="X")  # another action: filtered out
    start(other_team)  # another team: filtered out
    client = logged_in(reviewer)
    preview = client.get(
        "/bulk/", {"verb": "approve", "all": "1", "filter_team": "finance", "filter_action": "send_invoice"}
    ).content.decode()
    ids = re.findall(r'name="ids" value="(\d+)"', preview)
    assert sorted(map(int, ids)) == sorted(it.pk for it in invoices)
    late = start(team)  # arrives after the preview: not decided by it
    refused = client.post("/bulk/", {"verb": "approve", "all": "1", "filter_team": "finance"})
    assert refused.status_code == 400 and "Nothing selected" in refused.content.decode()
    assert status(late) == "pending"
    page = client.post("/bulk/", {"verb": "approve", "ids": ids}).content.decode()
    assert "Approved 2 of 2" in page
    assert [status(it) for it in invoices] == ["approved", "approved"] and status(late) == "pending"


def test_another_teams_interrupts_are_not_listed_nor_decided_and_bad_input_says_so(
    team: Team, other_team: Team, reviewer: User
) -> None:
    theirs = start(other_team)
    client = logged_in(reviewer)
    response = client.post("/bulk/", {"verb": "approve", "ids": [theirs.pk]})
    assert response.status_code == 400 and "Nothing selected" in response.content.decode()
    assert status(theirs) == "pending"
    # Not ids a database has (a superscript digit, beyond 64 bits): nothing selected, not a 500.
    assert client.get("/bulk/", {"verb": "approve", "ids": ["x", "-1", "²", "9" * 30]}).status_code == 400
    bad_verb = client.post("/bulk/", {"verb": "delete", "ids": [theirs.pk]})
    assert bad_verb.status_code == 400 and "Choose Approve or Reject" in bad_verb.content.decode()
    assert client.get("/bulk/", {"verb": "approve"}).status_code == 400
    assert Client().get("/bulk/", {"verb": "approve"}).status_code == 302  # to the login


def test_the_inbox_rows_can_be_ticked_for_a_bulk_decision_without_javascript(
    team: Team, reviewer: User
) -> None:
    it = start(team)
    page = logged_in(reviewer).get("/").content.decode()
    assert '<form id="bulk" method="get" action="/bulk/"' in page
    assert f'<input type="checkbox" name="ids" value="{it.pk}" form="bulk"' in page
    assert 'name="verb" value="approve"' in page and 'name="verb" value="reject"' in page


@pytest.mark.django_db
@pytest.mark.usefixtures("steps")
def test_a_bulk_approval_leaves_out_what_its_own_answer_schema_would_not_take(
    team: Team, reviewer: User, token_key: str
) -> None:
    """An approval asked through the API with an answer schema: one that takes the bulk answer
    ({approved, comment}) is approved with the rest; one that wants another (a field of its own,
    no other properties) is left out, to be opened and answered, never stored with an answer
    that does not fit."""
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_key}")

    def ask(message: str, schema: dict[str, Any]) -> Interrupt:
        body = {"message": message, "answer_schema": schema}
        approval = api.post("/api/approvals", body, content_type="application/json").json()
        return Interrupt.objects.get(pk=approval["interrupt_id"])

    strict = ask(
        "Which window?",
        {
            "type": "object",
            "properties": {"window": {"enum": ["tonight", "weekend"]}},
            "required": ["window"],
            "additionalProperties": False,
        },
    )
    loose = ask("Any remark?", {"type": "object", "properties": {"comment": {"type": "string"}}})
    page = logged_in(reviewer).get("/bulk/", query("approve", [strict.pk, loose.pk])).content.decode()
    assert outcome(page, strict) == "skipped: left out Left out: it needs a typed answer; open it to approve."
    assert outcome(page, loose) == "approve: approve"
    form = {"verb": "approve", "ids": [strict.pk, loose.pk], "comment": ""}
    logged_in(reviewer).post("/bulk/", form)
    assert [status(strict), status(loose)] == ["pending", "approved"]
