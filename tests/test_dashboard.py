"""The reviewers' dashboard pages, in-process (the live parts are in test_consumers and the
browser tests)."""

from __future__ import annotations

import json
from datetime import timedelta
from html import unescape
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from actions import engine
from actions.models import Interrupt, Policy, Run, Team

# Runs with steps in workers and inline (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps")]


def start(team: Team, action: str = "send_invoice", **payload: Any) -> Interrupt:
    payload = payload or {"invoice_id": "INV-9", "amount": 12.5}
    run = engine.start_run(action, payload, team, None, Run.Consumer.API)
    return run.interrupts.get(status="pending")


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_pages_require_login(client: Client, team: Team) -> None:
    it = start(team)
    for url in ("/", f"/interrupts/{it.pk}/", f"/runs/{it.run_id}/", "/start/", "/runs/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_inbox_lists_pending_interrupts_of_my_teams_with_a_count_in_the_title(
    team: Team, other_team: Team, reviewer: User
) -> None:
    mine = start(team)
    start(other_team, "transfer_funds", amount=5.0, to="X")
    page = logged_in(reviewer).get("/").content.decode()
    assert "<title>(1) Inbox" in page
    assert f'id="interrupt-{mine.pk}"' in page
    assert "invoice_id: INV-9, amount: 12.5" in page
    assert "transfer" not in page.lower().split("<select")[0]


def test_inbox_filters_by_action_and_team(team: Team, reviewer: User) -> None:
    start(team)
    transfer = start(team, "transfer_funds", amount=5.0, to="X")
    client = logged_in(reviewer)
    page = client.get("/", {"action": "transfer_funds"}).content.decode()
    assert "<title>(1) Inbox" in page and f"interrupt-{transfer.pk}" in page
    assert "<title>(0) Inbox" in client.get("/", {"team": "nope"}).content.decode()


def test_the_inbox_fragment_is_served_to_htmx(team: Team, reviewer: User) -> None:
    start(team)
    response = logged_in(reviewer).get("/", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="inbox"') and 'data-count="1"' in body


def test_the_inbox_counts_every_pending_interrupt_not_only_the_rows_it_lists(
    team: Team, reviewer: User
) -> None:
    from actions.web.views import INBOX_LIMIT

    for _ in range(INBOX_LIMIT + 5):
        start(team)
    page = logged_in(reviewer).get("/").content.decode()
    assert f"<title>({INBOX_LIMIT + 5}) Inbox" in page
    assert f'<strong id="inbox-count">{INBOX_LIMIT + 5}</strong>' in page
    assert page.count('<tr id="interrupt-') == INBOX_LIMIT
    assert f"the newest <span>{INBOX_LIMIT}</span> shown" in page


def test_the_inbox_says_which_stream_numbers_its_rows_are_as_of(
    team: Team, other_team: Team, reviewer: User
) -> None:
    other_team.members.add(reviewer)
    first = start(team)
    start(team)
    engine.resume(first, {"approved": True}, reviewer)
    html = logged_in(reviewer).get("/", headers={"HX-Request": "true"}).content.decode()
    # Two created and one decided in the first team's stream; nothing yet in the other's.
    seq = json.loads(unescape(html.split('data-seq="')[1].split('"')[0]))
    assert seq == {str(team.pk): 3, str(other_team.pk): 0}
    assert f'data-teams="{",".join(sorted([str(team.pk), str(other_team.pk)], key=int))}"' in html


def test_a_team_filter_shows_what_was_escalated_to_the_team(
    team: Team, other_team: Team, reviewer: User
) -> None:
    other_team.members.add(reviewer)
    Policy.objects.create(team=team, action="send_invoice", escalate_after_minutes=1, escalate_to=other_team)
    escalated = start(team)
    engine.apply_policies(now=timezone.now() + timedelta(minutes=2))
    page = logged_in(reviewer).get("/", {"team": other_team.slug}).content.decode()
    assert f'id="interrupt-{escalated.pk}"' in page and "<title>(1) Inbox" in page


def test_another_teams_interrupt_and_run_are_404(team: Team, outsider: User) -> None:
    it = start(team)
    client = logged_in(outsider)
    assert client.get(f"/interrupts/{it.pk}/").status_code == 404
    assert client.get(f"/runs/{it.run_id}/").status_code == 404
    assert client.post(f"/interrupts/{it.pk}/approve/", {}).status_code == 404
    assert client.post(f"/interrupts/{it.pk}/reject/", {"reject-reason": "x"}).status_code == 404
    it.refresh_from_db()
    assert it.status == "pending"


def test_staff_audit_but_only_members_decide(team: Team, auditor: User) -> None:
    it = start(team)
    client = logged_in(auditor)
    page = client.get(f"/interrupts/{it.pk}/").content.decode()
    assert "Only members of Finance can decide this." in page and "Approve</button>" not in page
    assert client.post(f"/interrupts/{it.pk}/approve/", {}).status_code == 403
    it.refresh_from_db()
    assert it.status == "pending"


def test_the_detail_page_renders_data_readably_and_escapes_it(team: Team, reviewer: User) -> None:
    it = start(team, invoice_id="<script>alert(1)</script>", amount=3.0)
    page = logged_in(reviewer).get(f"/interrupts/{it.pk}/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<dl class="data"><dt>invoice_id</dt>' in page


def test_approving_without_an_answer_model_sends_approved_and_the_comment(team: Team, reviewer: User) -> None:
    it = start(team)
    response = logged_in(reviewer).post(f"/interrupts/{it.pk}/approve/", {"answer-comment": "looks right"})
    assert response.status_code == 302 and response["Location"] == "/"
    run = Run.objects.get(pk=it.run_id)
    assert run.status == "completed"
    assert run.output["approved_by_answer"] == {"approved": True, "comment": "looks right"}


def test_the_typed_answer_form_follows_the_answer_model(team: Team, reviewer: User) -> None:
    it = start(team, "delete_customer_data", customer_id="cus_1")
    page = logged_in(reviewer).get(f"/interrupts/{it.pk}/").content.decode()
    assert 'name="answer-confirm_customer_id"' in page
    assert '<option value="everything">everything</option>' in page
    assert 'name="answer-notify_customer"' in page and "checked" in page
    assert "Ticket that authorises this" in page


def test_an_invalid_typed_answer_shows_field_errors_and_changes_nothing(team: Team, reviewer: User) -> None:
    it = start(team, "delete_customer_data", customer_id="cus_1")
    client = logged_in(reviewer)
    response = client.post(
        f"/interrupts/{it.pk}/approve/",
        {"answer-confirm_customer_id": "cus_1", "answer-scope": "personal_data", "answer-ticket": "x"},
    )
    assert response.status_code == 422
    assert "at least 3 characters" in response.content.decode()
    it.refresh_from_db()
    assert it.status == "pending"
    response = client.post(
        f"/interrupts/{it.pk}/approve/",
        {"answer-confirm_customer_id": "cus_1", "answer-scope": "everything", "answer-ticket": "SEC-12"},
    )
    assert response.status_code == 302
    run = Run.objects.get(pk=it.run_id)
    assert run.output == {"deleted": "cus_1", "scope": "everything", "ticket": "SEC-12"}
    answer = run.interrupts.get(seq=1).answer
    assert answer == {
        "confirm_customer_id": "cus_1",
        "scope": "everything",
        "notify_customer": False,
        "ticket": "SEC-12",
    }


def test_reject_needs_a_reason(team: Team, reviewer: User) -> None:
    it = start(team)
    client = logged_in(reviewer)
    response = client.post(f"/interrupts/{it.pk}/reject/", {"reject-reason": ""})
    assert response.status_code == 422 and "This field is required" in response.content.decode()
    client.post(f"/interrupts/{it.pk}/reject/", {"reject-reason": "wrong amount"})
    run = Run.objects.get(pk=it.run_id)
    assert (run.status, run.error) == ("rejected", "wrong amount")


def test_a_late_reviewer_is_told_who_decided_instead_of_getting_a_form(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    it = start(team)
    logged_in(reviewer).post(f"/interrupts/{it.pk}/approve/", {})
    late = logged_in(second_reviewer)
    response = late.post(f"/interrupts/{it.pk}/reject/", {"reject-reason": "no"})
    assert response.status_code == 409
    page = response.content.decode()
    assert "Not rejected: already approved by reviewer1 at" in page
    assert "Approve</button>" not in page
    assert (
        "Already approved by <strong>reviewer1</strong>" in late.get(f"/interrupts/{it.pk}/").content.decode()
    )


def test_htmx_decisions_swap_the_decision_panel(team: Team, reviewer: User) -> None:
    it = start(team)
    response = logged_in(reviewer).post(f"/interrupts/{it.pk}/approve/", {}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<section id="decision-')
    assert "Already approved by <strong>reviewer1</strong>" in body


def test_the_panel_refetch_keeps_a_pending_form_and_replaces_a_decided_one(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    it = start(team)
    client = logged_in(second_reviewer)
    url = f"/interrupts/{it.pk}/?panel=1&known=pending"
    assert client.get(url, headers={"HX-Request": "true"}).status_code == 204
    engine.resume(it, {"approved": True}, reviewer)
    response = client.get(url, headers={"HX-Request": "true"})
    assert (
        response.status_code == 200
        and "Already approved by <strong>reviewer1</strong>" in response.content.decode()
    )


def test_the_run_page_shows_the_transcript(team: Team, reviewer: User) -> None:
    it = start(team, "transfer_funds", amount=2000.0, to="DE12")
    engine.resume(it, {"approved": True, "comment": "first ok"}, reviewer)
    second = Interrupt.objects.get(run=it.run_id, seq=2)
    engine.reject(second, "limit reached", reviewer)
    page = logged_in(reviewer).get(f"/runs/{it.run_id}/").content.decode()
    order = [
        "Started by",
        "Paused:",
        "Approved by <strong>reviewer1</strong>",
        "first ok",
        "Resumed",
        "Second confirmation",
        "Rejected by <strong>reviewer1</strong>: limit reached",
        "The run ended rejected",  # its own event (run.finished), not a second "Rejected by"
    ]
    positions = [page.index(text) for text in order]
    assert positions == sorted(positions)
    assert page.count("Rejected by") == 1
    assert 'class="chip status-rejected" id="run-status">rejected<' in page


def test_a_run_can_be_started_from_a_form_generated_from_the_input_schema(team: Team, reviewer: User) -> None:
    client = logged_in(reviewer)
    listing = client.get("/start/").content.decode()
    assert '<a href="/start/send_invoice/"><code>send_invoice</code></a>' in listing
    assert "Send an invoice to the customer, once a reviewer approves it." in listing
    page = client.get("/start/send_invoice/").content.decode()
    assert 'name="input-invoice_id"' in page and 'name="input-amount"' in page
    bad = client.post(
        "/start/send_invoice/", {"team": "finance", "input-invoice_id": "A", "input-amount": "-5"}
    )
    assert bad.status_code == 422 and "greater than" in bad.content.decode()
    assert not Run.objects.exists()
    good = client.post(
        "/start/send_invoice/", {"team": "finance", "input-invoice_id": "A-1", "input-amount": "5"}
    )
    run = Run.objects.get()
    assert good.status_code == 302 and good["Location"] == f"/runs/{run.pk}/"
    assert (run.consumer, run.status, run.started_by) == ("dashboard", "interrupted", reviewer)


def test_a_run_cannot_be_started_in_another_teams_name(team: Team, other_team: Team, reviewer: User) -> None:
    response = logged_in(reviewer).post(
        "/start/send_invoice/", {"team": "payroll", "input-invoice_id": "A", "input-amount": "5"}
    )
    assert response.status_code == 422 and "Choose one of your teams" in response.content.decode()
    assert not Run.objects.exists()


def test_every_page_shows_who_is_logged_in_with_logout(team: Team, reviewer: User) -> None:
    page = logged_in(reviewer).get("/runs/").content.decode()
    assert "Signed in as <strong>reviewer1</strong>" in page
    assert 'action="/logout/"' in page


def test_a_member_cancels_a_run_from_its_page_after_confirming(
    team: Team, reviewer: User, outsider: User, auditor: User
) -> None:
    it = start(team)
    client = logged_in(reviewer)
    assert f'id="interrupt-{it.pk}"' in client.get("/").content.decode()
    page = client.get(f"/runs/{it.run_id}/").content.decode()
    assert f'action="/runs/{it.run_id}/cancel/"' in page and 'name="confirm"' in page

    unconfirmed = client.post(f"/runs/{it.run_id}/cancel/", follow=True)
    assert "tick the box to confirm" in unconfirmed.content.decode()
    assert Run.objects.get(pk=it.run_id).status == "interrupted"
    assert logged_in(outsider).post(f"/runs/{it.run_id}/cancel/", {"confirm": "yes"}).status_code == 404

    done = client.post(f"/runs/{it.run_id}/cancel/", {"confirm": "yes"}, follow=True)
    assert f"Cancelled run {it.run_id}" in done.content.decode()
    assert Run.objects.get(pk=it.run_id).status == "cancelled"
    it.refresh_from_db()
    assert it.status == "cancelled" and it.decided_by == reviewer
    assert 'name="confirm"' not in done.content.decode(), "a finished run offers no cancel"
    assert f'id="interrupt-{it.pk}"' not in client.get("/").content.decode(), "it left the inbox"

    again = client.post(f"/runs/{it.run_id}/cancel/", {"confirm": "yes"}, follow=True)
    assert f"Not cancelled: run {it.run_id} is already cancelled." in again.content.decode()


def test_a_staff_auditor_sees_the_run_but_cannot_cancel_it_and_a_get_changes_nothing(
    team: Team, auditor: User
) -> None:
    it = start(team)
    client = logged_in(auditor)
    page = client.get(f"/runs/{it.run_id}/").content.decode()
    assert page.count("Run ") and 'name="confirm"' not in page
    assert client.get(f"/runs/{it.run_id}/cancel/").status_code == 405
    refused = client.post(f"/runs/{it.run_id}/cancel/", {"confirm": "yes"}, follow=True)
    assert "Not cancelled: Only members of Finance can cancel this run." in refused.content.decode()
    assert Run.objects.get(pk=it.run_id).status == "interrupted"


def test_approve_and_next_opens_the_next_one_of_the_inbox_as_filtered_and_says_when_none_is_left(
    team: Team, other_team: Team, reviewer: User
) -> None:
    other_team.members.add(reviewer)
    first, second = start(team), start(team)
    start(other_team)  # filtered out below
    client = logged_in(reviewer)
    client.get("/?team=finance")
    # Newest first, as the inbox lists them: after the second comes the first.
    response = client.post(f"/interrupts/{second.pk}/approve/", {"then": "next"})
    assert response.status_code == 302 and response["Location"] == f"/interrupts/{first.pk}/"
    response = client.post(f"/interrupts/{first.pk}/reject/", {"reject-reason": "no", "then": "next"})
    assert response["Location"] == "/?team=finance"
    page = client.get("/?team=finance").content.decode()
    assert "That was the last one: nothing else is waiting in this inbox." in page
    first.refresh_from_db()
    second.refresh_from_db()
    assert (second.status, first.status) == ("approved", "rejected")
    htmx = client.post(
        f"/interrupts/{start(team).pk}/approve/", {"then": "next"}, headers={"HX-Request": "true"}
    )
    assert htmx.status_code == 200 and htmx["HX-Redirect"] == "/?team=finance"


def test_the_row_pushed_to_reviewers_is_the_row_the_inbox_shows(
    team: Team, other_team: Team, reviewer: User, second_reviewer: User, django_assert_num_queries: Any
) -> None:
    # A new interrupt's row is rendered once for every page that shows it (actions.live.push),
    # read as the engine reads; the inbox page reads its rows with the ORM. Both show the same:
    # its run, its team, where it was escalated to, and an N-of-M's count.
    import re

    from actions.engine import InboxChange
    from actions.live.push import inbox_frames
    from actions.models import Approval

    plain, it = start(team), start(team)
    Interrupt.objects.filter(pk=it.pk).update(
        approvals_required=2, escalate_to=other_team, escalated_at=timezone.now()
    )
    Approval.objects.create(interrupt=it, user=second_reviewer, answer={"approved": True})

    def change(of: Interrupt) -> InboxChange:
        return InboxChange("interrupt", of.run_id, of.pk, of.action, (), (team.pk,))

    # One new interrupt, the usual: its row with its run and team in one query, and for this
    # one the team it went to and its count, and no query left to the template.
    with django_assert_num_queries(3):
        (frame,) = inbox_frames([change(it)])
    with django_assert_num_queries(1):
        (plain_frame,) = inbox_frames([change(plain)])
    # A decided one leaves the inboxes: nothing read, not even a query built.
    decided = InboxChange("decided", plain.run_id, plain.pk, plain.action, (team.pk,), ())
    unread = mock.patch.object(Interrupt.objects, "filter", side_effect=AssertionError("read"))
    with unread, django_assert_num_queries(0):
        (gone,) = inbox_frames([decided])
    assert "html" not in gone
    # Several in one transaction (a delegation's): one query for all.
    with django_assert_num_queries(1):
        both = inbox_frames([change(it), change(plain), change(it)])
    assert [f["html"] for f in both] == [frame["html"], plain_frame["html"], frame["html"]]

    page = logged_in(reviewer).get("/").content.decode()
    for of, pushed in ((it, frame), (plain, plain_frame)):
        shown = re.search(rf'<tr id="interrupt-{of.pk}".*?</tr>', page, re.S)
        assert shown is not None and pushed["html"] == shown.group(0)
    assert "1 of 2 approvals" in frame["html"] and f"escalated to {other_team.name}" in frame["html"]
    assert "approvals" not in plain_frame["html"] and "escalated" not in plain_frame["html"]
