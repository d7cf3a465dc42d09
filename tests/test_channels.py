"""Reaching people: mail (Django's mail outbox here; a real SMTP server in
tests/integration/browser/test_channels_live.py), the personal decision link, Slack against a local server
speaking its Web API with signed interactions posted back, reminders, routing and preferences."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions import engine, notify
from actions.engine.deadlines import remind
from actions.models import (
    Interrupt,
    Notification,
    Policy,
    Preferences,
    Run,
    RunEvent,
    SlackMessage,
    Team,
    TeamChannels,
    TeamRule,
    Webhook,
)
from actions.notify import delivery
from tests.conftest import member
from tests.slack_server import SIGNING_SECRET, TOKEN, SlackServer, button, signed, submission

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(team: Team, reviewer: User, second_reviewer: User, outsider: User) -> dict[str, User]:
    for user in (reviewer, second_reviewer, outsider):
        user.email = f"{user.username}@example.com"
        user.save()
    return {"reviewer": reviewer, "second": second_reviewer, "outsider": outsider}


def start(team: Team, by: User | None = None, action: str = "send_invoice", **input: Any) -> Interrupt:
    payload = input or {"invoice_id": "INV-7", "amount": 120.5}
    run = engine.start_run(action, payload, team, by)
    return Interrupt.objects.get(run=run)


def told() -> int:
    return notify.dispatch()


def link_in(message: Any) -> str:
    found = re.search(r"http://testserver(/d/[^/\s]+/)", message.body)
    assert found, message.body
    return found.group(1)


@pytest.fixture(autouse=True)
def _links_point_here(settings: Any) -> None:
    settings.GRUNDLAG_BASE_URL = "http://testserver"


# Mail


def test_a_new_approval_mails_everyone_who_may_decide_it_in_text_and_html(
    team: Team, people: dict[str, User]
) -> None:
    interrupt = start(team)
    told()
    assert sorted(m.to[0] for m in mail.outbox) == ["reviewer1@example.com", "reviewer2@example.com"]
    message = next(m for m in mail.outbox if m.to == ["reviewer1@example.com"])
    assert message.subject == "[Grundlag approvals] Approval needed: Approve sending the invoice?"
    assert "invoice_id: INV-7" in message.body and "amount: 120.5" in message.body
    html, kind = message.alternatives[0]  # type: ignore[attr-defined]  # an EmailMultiAlternatives
    assert kind == "text/html" and "<dt>invoice_id</dt>" in html and "Review and decide" in html
    assert link_in(message) in html
    assert f"/interrupts/{interrupt.pk}/" in message.body
    assert "state" not in str(Notification.objects.values_list("payload", flat=True))


def test_a_big_teams_mails_go_in_a_few_tasks_and_a_webhook_in_one_of_its_own(
    client: Client,
    token_key: str,
    team: Team,
    people: dict[str, User],
    receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker delivers an event's mails DELIVERY_BATCH at a time, one after another; a webhook
    alone, so that an endpoint slow to answer holds up no mail. Every one is sent."""
    from actions.notify import delivery
    from actions.tasks import deliver_notifications
    from tests.test_webhooks import registered

    for n in range(3, 26):  # with the fixture's two reviewers, 25 to mail
        member = User.objects.create_user(f"member{n}", email=f"member{n}@example.com")
        team.members.add(member)
    hook = registered(client, token_key, receiver.url, ["interrupt.created"])
    batches: list[list[int]] = []
    send = deliver_notifications.apply_async

    def sent(args: tuple[list[int]], **options: Any) -> Any:
        batches.append(list(args[0]))
        return send(args, **options)

    monkeypatch.setattr(deliver_notifications, "apply_async", sent)
    start(team)
    told()
    webhook_ids = set(Notification.objects.filter(webhook_id=hook["id"]).values_list("pk", flat=True))
    assert len(webhook_ids) == 1 and batches[0] == sorted(webhook_ids), "the webhook first, alone"
    assert [len(batch) for batch in batches[1:]] == [delivery.DELIVERY_BATCH, 25 - delivery.DELIVERY_BATCH]
    assert len(mail.outbox) == 25 and len(receiver.verified(hook["secret"])) == 1
    assert set(Notification.objects.values_list("outcome", flat=True)) == {"delivered"}


def test_assigned_approvals_mail_the_assignees_only_and_mail_off_is_respected(
    team: Team, people: dict[str, User]
) -> None:
    Policy.objects.create(team=team, action="send_invoice", assignees="reviewer2,reviewer1")
    Preferences.objects.create(user=people["reviewer"], email=False)
    start(team)
    told()
    assert [m.to for m in mail.outbox] == [["reviewer2@example.com"]]


def test_what_a_rule_decides_as_it_is_created_mails_no_reviewer_only_whoever_asked(
    team: Team, people: dict[str, User]
) -> None:
    TeamRule.objects.create(team=team, name="small", when="data.amount < 200.0", then="approve")
    TeamChannels.objects.create(team=team, email_events=["interrupt.created", "interrupt.decided"])
    interrupt = start(team, by=people["second"])
    told()
    assert Interrupt.objects.get(pk=interrupt.pk).decided_by_name == "rule: small"
    subject = "[Grundlag approvals] Approved by rule: small: Approve sending the invoice?"
    assert [(m.to, m.subject) for m in mail.outbox] == [(["reviewer2@example.com"], subject)]


def test_a_team_chooses_which_events_mail_its_people(team: Team, people: dict[str, User]) -> None:
    TeamChannels.objects.create(team=team, email_events=["interrupt.decided"])
    interrupt = start(team, by=people["second"])
    told()
    assert mail.outbox == []
    engine.resume(interrupt, {"approved": True}, people["reviewer"])
    told()
    # The decision goes to whoever asked for it.
    assert [(m.to, m.subject) for m in mail.outbox] == [
        (
            ["reviewer2@example.com"],
            "[Grundlag approvals] Approved by reviewer1: Approve sending the invoice?",
        )
    ]


def test_a_digest_sends_the_periods_mails_as_one(team: Team, people: dict[str, User]) -> None:
    Preferences.objects.create(user=people["reviewer"], email_digest=True)
    start(team, invoice_id="D-1", amount=1)
    start(team, invoice_id="D-2", amount=2)
    told()
    assert [m.to for m in mail.outbox] == [["reviewer2@example.com"]] * 2, "the digest waits for its time"
    due = Notification.objects.filter(digest=True)
    assert due.count() == 2 and all(n.next_attempt_at > timezone.now() for n in due)
    due.update(next_attempt_at=timezone.now())
    assert notify.deliver_due() == 1, "one sender for a person's digest, which takes the rest"
    digests = [m for m in mail.outbox if m.to == ["reviewer1@example.com"]]
    assert len(digests) == 1, "one mail for both"
    assert digests[0].subject == "[Grundlag approvals] 2 approvals for you"
    assert "invoice_id: D-1" in digests[0].body and "invoice_id: D-2" in digests[0].body
    assert len(re.findall(r"/d/[^/\s]+/", str(digests[0].body))) == 2, "each with its own link"
    assert set(due.values_list("outcome", flat=True)) == {"delivered"}


def test_a_mail_no_longer_for_its_recipient_is_not_sent(team: Team, people: dict[str, User]) -> None:
    """Chosen when the event was told, sent an hour later (a digest): by then one person has
    left the team, and one approval was decided. Those are not sent, and say why (the first
    reason found: a decision made meanwhile, which needs no query, before the membership)."""
    Preferences.objects.create(user=people["reviewer"], email_digest=True)
    Preferences.objects.create(user=people["second"], email_digest=True)
    start(team, invoice_id="STILL-1", amount=1)
    decided = start(team, invoice_id="GONE-1", amount=1)
    told()
    engine.reject(decided, "sent by hand", people["second"])
    team.members.remove(people["reviewer"])
    Notification.objects.filter(digest=True).update(next_attempt_at=timezone.now())
    while notify.deliver_due():
        pass
    (digest,) = mail.outbox
    assert digest.to == ["reviewer2@example.com"] and "STILL-1" in digest.body and "GONE-1" not in digest.body
    reasons = sorted(
        Notification.objects.filter(outcome="skipped").values_list("delivery_attempts__error", flat=True)
    )
    assert reasons == [
        "not sent: it was rejected meanwhile",
        "not sent: it was rejected meanwhile",  # also no longer in the team
        "not sent: the recipient is no longer in the interrupt's team",
    ]


@pytest.mark.usefixtures("database")
def test_the_mails_of_an_approval_decided_before_they_went_are_skipped_together(
    team: Team, people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big team's "new approval" mails reach their sender after the approval was decided (a
    quick reviewer, an agent's caller): none is sent, each says why, and the batch is skipped in
    a few statements, not in a claim, a read and a record for each mail."""
    for n in range(3, 9):
        user = member(team, f"reviewer{n}")
        user.email = f"reviewer{n}@example.com"
        user.save()
    handed: list[list[int]] = []
    monkeypatch.setattr(delivery, "schedule_all", lambda ids, **kwargs: handed.append(list(ids)))
    interrupt = start(team)
    told()
    (mails,) = [ids for ids in handed if len(ids) > 1]
    assert len(mails) == 8
    engine.reject(interrupt, "sent by hand", people["second"])
    User.objects.filter(username="reviewer8").update(is_active=False)  # left meanwhile
    with CaptureQueriesContext(connection) as queries:
        delivery.deliver_each(mails)
    assert mail.outbox == []
    reasons = Counter(
        Notification.objects.filter(pk__in=mails).values_list(
            "outcome", "attempts", "delivery_attempts__error"
        )
    )
    assert reasons == {
        ("skipped", 1, "not sent: it was rejected meanwhile"): 7,
        ("skipped", 1, "not sent: the recipient's account is disabled"): 1,  # its own reason, as before
    }
    assert len(queries.captured_queries) <= 12, [q["sql"][:80] for q in queries.captured_queries]


@pytest.mark.usefixtures("database")
def test_an_approval_decided_before_it_was_told_asks_no_one_and_goes_to_no_sender(
    team: Team, people: dict[str, User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answered within the gathering time (an API caller, an agent): the requests for that
    decision to people are recorded as not sent, saying why, in the transaction that tells the
    event, and no sender is handed them. What else the event tells still goes: its webhook, and
    the answer to whoever asked."""
    hook = Webhook.objects.create(team=team, url="http://127.0.0.1:9/hook", events=["interrupt.created"])
    handed: list[list[int]] = []
    monkeypatch.setattr(delivery, "schedule_all", lambda ids, **kwargs: handed.append(list(ids)))
    interrupt = start(team, by=people["second"])
    engine.resume(interrupt, {"approved": True}, people["reviewer"])
    told()
    asked = Notification.objects.filter(type="interrupt.created", webhook=None)
    assert sorted(
        asked.values_list("recipient__username", "outcome", "attempts", "delivery_attempts__error")
    ) == [
        ("reviewer1", "skipped", 1, "not sent: it was approved meanwhile"),
        ("reviewer2", "skipped", 1, "not sent: it was approved meanwhile"),
    ]
    told_hook = Notification.objects.get(type="interrupt.created", webhook=hook)
    assert told_hook.outcome == "pending" and told_hook.attempts == 0
    answered = Notification.objects.get(type="interrupt.decided", channel="email")
    assert answered.recipient == people["second"] and answered.outcome == "pending", "the asker hears of it"
    assert sorted(pk for ids in handed for pk in ids) == sorted([told_hook.pk, answered.pk])


@pytest.fixture
def early_in_the_hour(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock a minute past the hour, still running, so an hour's digest is 59 minutes away
    whenever the test runs (at 12:50 a 20 minute deadline would fall after the digest)."""
    settings.GRUNDLAG_DIGEST_SECONDS = 3600
    real = timezone.now
    start = real()
    shift = start.replace(minute=1, second=0, microsecond=0) + timedelta(hours=1) - start
    monkeypatch.setattr(timezone, "now", lambda: real() + shift)


@pytest.mark.usefixtures("early_in_the_hour")
def test_what_cannot_wait_is_not_held_for_the_digest(team: Team, people: dict[str, User]) -> None:
    Preferences.objects.create(user=people["reviewer"], email_digest=True)
    Policy.objects.create(team=team, action="send_invoice", deadline_minutes=20)
    interrupt = start(team, by=people["reviewer"])
    told()
    assert sorted(m.to[0] for m in mail.outbox) == ["reviewer1@example.com", "reviewer2@example.com"]
    # A decision can wait for the digest of whoever asked.
    engine.resume(interrupt, {"approved": True}, people["second"])
    told()
    assert len(mail.outbox) == 2
    assert Notification.objects.get(type="interrupt.decided", recipient=people["reviewer"]).digest


# The decision link


def test_opening_the_link_decides_nothing_and_its_post_decides_as_its_recipient_once(
    client: Client, team: Team, people: dict[str, User]
) -> None:
    interrupt = start(team)
    told()
    link = link_in(next(m for m in mail.outbox if m.to == ["reviewer1@example.com"]))
    for method in (client.get, client.head):
        response = method(link)
        assert response.status_code == 200
    page = client.get(link)
    assert b"Deciding as <strong>reviewer1</strong>" in page.content and b"INV-7" in page.content
    assert page["Referrer-Policy"] == "same-origin"
    interrupt.refresh_from_db()
    assert interrupt.is_pending, "GET and HEAD never decide"

    response = client.post(link, {"decision": "approve", "answer-comment": "ok by mail"})
    assert response.status_code == 200 and b"Approved by you" in response.content
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.decided_by, interrupt.decided_via) == (
        "approved",
        people["reviewer"],
        "email",
    )
    event = RunEvent.objects.get(interrupt=interrupt, kind="approved")
    assert event.detail["via"] == "email" and event.actor == people["reviewer"]

    again = client.post(link, {"decision": "reject", "reject-reason": "changed my mind"})
    assert again.status_code == 410 and b"Already approved by <strong>reviewer1</strong>" in again.content
    interrupt.refresh_from_db()
    assert interrupt.status == "approved"


def test_a_tampered_expired_or_reused_link_gets_a_clear_page_and_changes_nothing(
    client: Client, team: Team, people: dict[str, User]
) -> None:
    Policy.objects.create(team=team, action="send_invoice", approvals_required=2)
    interrupt = start(team)
    told()
    link = link_in(next(m for m in mail.outbox if m.to == ["reviewer1@example.com"]))
    other = link_in(next(m for m in mail.outbox if m.to == ["reviewer2@example.com"]))

    # Another's link with this one's signature, or a character changed: not valid.
    token, other_token = link.split("/")[2], other.split("/")[2]
    forged = f"/d/{other_token.split(':')[0]}:{token.split(':', 1)[1]}/"
    for bad in (forged, link[:-3] + ("A" if link[-3] != "A" else "B") + "/", "/d/nonsense/"):
        response = client.post(bad, {"decision": "approve"})
        assert response.status_code == 404 and b"This link is not valid" in response.content

    # One approval of two, by mail: counted, and the link is used up.
    assert client.post(link, {"decision": "approve"}).status_code == 200
    reused = client.post(link, {"decision": "approve"})
    assert reused.status_code == 410 and b"already used" in reused.content
    assert interrupt.approvals.count() == 1

    Notification.objects.filter(recipient=people["second"]).update(
        created_at=timezone.now() - timedelta(days=8)
    )
    expired = client.post(other, {"decision": "approve"})
    assert expired.status_code == 410 and b"This link expired" in expired.content
    interrupt.refresh_from_db()
    assert interrupt.is_pending and interrupt.approvals.count() == 1


def test_a_link_keeps_every_rule_of_the_dashboard(
    client: Client, team: Team, people: dict[str, User]
) -> None:
    # The requester may not approve their own transfer; they may still withdraw it.
    interrupt = start(team, by=people["reviewer"], action="transfer_funds", amount=5000, to="X")
    told()
    link = link_in(next(m for m in mail.outbox if m.to == ["reviewer1@example.com"]))
    refused = client.post(link, {"decision": "approve"})
    assert refused.status_code == 403 and b"Separation of duties" in refused.content
    interrupt.refresh_from_db()
    assert interrupt.is_pending
    # Removed from the team since the mail: the link no longer decides.
    team.members.remove(people["reviewer"])
    gone = client.get(link)
    assert gone.status_code == 403 and b"You may not decide this" in gone.content
    team.members.add(people["reviewer"])
    # A reason is required to reject; the link stays usable after a form error.
    assert client.post(link, {"decision": "reject", "reject-reason": ""}).status_code == 422
    assert client.post(link, {"decision": "reject", "reject-reason": "wrong account"}).status_code == 200
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.reason) == ("rejected", "wrong account")


# Slack


@pytest.fixture
def slack(settings: Any, team: Team) -> Iterator[SlackServer]:
    server = SlackServer()
    settings.SLACK_BOT_TOKEN, settings.SLACK_SIGNING_SECRET, settings.SLACK_API_URL = (
        TOKEN,
        SIGNING_SECRET,
        server.url,
    )
    TeamChannels.objects.create(team=team, slack_channel="C0FINANCE", email_events=[])
    yield server
    server.stop()


def interact(client: Client, payload: dict[str, Any], **kwargs: Any) -> Any:
    body, headers = signed(payload, **kwargs)
    return client.post(
        "/slack/interactions", body, content_type="application/x-www-form-urlencoded", headers=headers
    )


def test_a_new_approval_is_posted_to_the_teams_channel_and_approved_from_its_button(
    client: Client, team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team)
    told()
    (posted,) = slack.called("chat.postMessage")
    assert (
        posted["channel"] == "C0FINANCE" and posted["text"] == "Approval needed: Approve sending the invoice?"
    )
    buttons = next(b for b in posted["blocks"] if b["type"] == "actions")["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Approve", "Reject", "Open"]
    assert "INV-7" in str(posted["blocks"])
    message = SlackMessage.objects.get(interrupt=interrupt)

    slack.add_user("U1", "reviewer1@example.com")
    assert interact(client, button("grundlag_approve", interrupt.pk, "U1")).status_code == 200
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.decided_by, interrupt.decided_via) == (
        "approved",
        people["reviewer"],
        "slack",
    )
    assert RunEvent.objects.get(interrupt=interrupt, kind="approved").detail["via"] == "slack"
    told()
    (updated,) = slack.called("chat.update")
    assert (updated["channel"], updated["ts"]) == (message.channel, message.ts)
    assert "*Approved* by reviewer1 at" in str(updated["blocks"])
    assert not any(b["type"] == "actions" for b in updated["blocks"]), "no buttons once decided"


def test_reject_opens_a_modal_for_the_reason_and_its_submission_decides(
    client: Client, team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team)
    told()
    slack.add_user("U2", "reviewer2@example.com")
    interact(client, button("grundlag_reject", interrupt.pk, "U2"))
    (opened,) = slack.called("views.open")
    view = opened["view"]
    assert [b["block_id"] for b in view["blocks"] if b["type"] == "input"] == ["reject-reason"]
    empty = interact(client, submission(view, {"reject-reason": ""}, "U2"))
    assert empty.json()["response_action"] == "errors" and "reject-reason" in empty.json()["errors"]
    assert interact(client, submission(view, {"reject-reason": "duplicate invoice"}, "U2")).status_code == 200
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.reason, interrupt.decided_by) == (
        "rejected",
        "duplicate invoice",
        people["second"],
    )


def test_an_answer_model_is_asked_for_in_a_modal(
    client: Client, team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team, by=people["second"], action="delete_customer_data", customer_id="C-9")
    told()
    slack.add_user("U1", "reviewer1@example.com")
    interact(client, button("grundlag_approve", interrupt.pk, "U1"))
    view = slack.called("views.open")[0]["view"]
    fields = {b["block_id"]: b["element"]["type"] for b in view["blocks"] if b["type"] == "input"}
    assert fields == {
        "answer-confirm_customer_id": "plain_text_input",
        "answer-scope": "static_select",
        "answer-notify_customer": "checkboxes",
        "answer-ticket": "plain_text_input",
    }
    short = interact(
        client, submission(view, {"answer-confirm_customer_id": "C-9", "answer-ticket": "T"}, "U1")
    )
    assert "answer-ticket" in short.json()["errors"]
    done = interact(
        client, submission(view, {"answer-confirm_customer_id": "C-9", "answer-ticket": "T-100"}, "U1")
    )
    assert done.status_code == 200
    interrupt.refresh_from_db()
    assert interrupt.status == "approved" and interrupt.answer["ticket"] == "T-100"
    # Left as the modal filled them in: the model's defaults, not unticked or empty.
    assert interrupt.answer["notify_customer"] is True and interrupt.answer["scope"] == "personal_data"
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert inputs["answer-notify_customer"]["initial_options"][0]["value"] == "on"
    assert inputs["answer-scope"]["initial_option"]["value"] == "personal_data"


def test_unsigned_stale_unmapped_or_unauthorised_clicks_change_nothing(
    client: Client, team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team)
    told()
    click = button("grundlag_approve", interrupt.pk, "U1")
    slack.add_user("U1", "reviewer1@example.com")
    assert interact(client, click, secret="not-the-secret").status_code == 401
    assert interact(client, click, at=timezone.now().timestamp() - 600).status_code == 401
    assert client.post("/slack/interactions", {"payload": "{}"}).status_code == 401

    slack.add_user("U9", "nobody@example.com")
    interact(client, button("grundlag_approve", interrupt.pk, "U9"))
    slack.add_user("U8", "reviewer2@example.com", confirmed=False)
    interact(client, button("grundlag_approve", interrupt.pk, "U8"))
    slack.add_user("U7", "payroll1@example.com")
    interact(client, button("grundlag_approve", interrupt.pk, "U7"))
    # A shared channel's user of another workspace, whose admins set their mail to ours: the
    # bot's own workspace (auth.test, or SLACK_TEAM_ID) is the only one heard.
    slack.add_user("U6", "reviewer1@example.com", team="T0OTHER")
    assert interact(client, button("grundlag_approve", interrupt.pk, "U6", team="T0OTHER")).status_code == 403
    told_privately = [call["text"] for call in slack.called("chat.postEphemeral")]
    assert len(told_privately) == 3
    assert "link your Slack account" in told_privately[0]
    assert "no confirmed mail address" in told_privately[1]
    assert "You may not decide this" in told_privately[2]
    interrupt.refresh_from_db()
    assert interrupt.is_pending

    # An explicit link in the preferences maps a Slack user whose mail does not match.
    Preferences.objects.create(user=people["second"], slack_user_id="U8")
    interact(client, button("grundlag_approve", interrupt.pk, "U8"))
    interrupt.refresh_from_db()
    assert interrupt.decided_by == people["second"]
    interact(client, button("grundlag_approve", interrupt.pk, "U1"))
    assert "Approved by reviewer2" in slack.called("chat.postEphemeral")[-1]["text"]


def test_a_decision_made_elsewhere_updates_the_message_and_assigned_ones_go_to_the_assignee(
    team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team)
    told()
    engine.reject(interrupt, "not this month", people["reviewer"])
    told()
    assert "*Rejected* by reviewer1" in str(slack.called("chat.update")[0]["blocks"])

    Policy.objects.create(team=team, action="send_invoice", assignees="reviewer2")
    slack.add_user("U2", "reviewer2@example.com")
    start(team)
    told()
    direct = slack.called("chat.postMessage")[-1]
    assert direct["channel"] == "U2", "to the assignee, not the channel"


def test_a_reminder_before_the_deadline_is_mailed_and_threaded_once(
    settings: Any, team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    TeamChannels.objects.filter(team=team).update(email_events=["interrupt.expiring"])
    Policy.objects.create(team=team, action="send_invoice", deadline_minutes=120)
    interrupt = start(team)
    told()
    now = timezone.now()
    assert remind(now) == 0, "not yet"
    assert remind(now + timedelta(minutes=61)) == 1
    assert remind(now + timedelta(minutes=62)) == 0, "once"
    told()
    assert sorted(m.to[0] for m in mail.outbox) == ["reviewer1@example.com", "reviewer2@example.com"]
    assert mail.outbox[0].subject.startswith("[Grundlag approvals] Deadline soon:")
    thread = slack.called("chat.postMessage")[-1]
    assert thread["thread_ts"] == SlackMessage.objects.get(interrupt=interrupt).ts
    assert thread["text"].startswith("Still waiting: the deadline is")


# Preferences


def test_a_person_turns_their_mail_off_or_to_a_digest(client: Client, people: dict[str, User]) -> None:
    client.force_login(people["reviewer"])
    page = client.get("/settings/notifications/")
    assert page.status_code == 200 and b"Your notifications" in page.content
    refused = client.post("/settings/notifications/", {"email_digest": "on"})
    assert refused.status_code == 200 and b"A digest is mail" in refused.content
    assert not Preferences.objects.exists()
    assert client.post("/settings/notifications/", {"email": "on", "email_digest": "on"}).status_code == 302
    assert client.post("/settings/notifications/", {}).status_code == 302
    prefs = Preferences.objects.get(user=people["reviewer"])
    assert (prefs.email, prefs.email_digest) == (False, False)
    assert Run.objects.count() == 0


def test_an_escalation_mails_the_team_it_went_to(
    team: Team, other_team: Team, people: dict[str, User]
) -> None:
    Policy.objects.create(team=team, action="send_invoice", escalate_after_minutes=10, escalate_to=other_team)
    start(team)
    told()
    mail.outbox.clear()
    assert engine.apply_policies(now=timezone.now() + timedelta(minutes=11)) == 1
    told()
    (escalated,) = mail.outbox
    assert escalated.to == ["payroll1@example.com"]
    assert escalated.subject == "[Grundlag approvals] Escalated to your team: Approve sending the invoice?"
    assert "/d/" in escalated.body


def test_a_link_is_used_up_with_its_decision_or_not_at_all(team: Team, people: dict[str, User]) -> None:
    """What the engine's ``also`` raises undoes the decision it ran in (the link's use is one
    transaction with the decision)."""
    interrupt = start(team)

    class Refused(Exception):
        pass

    def used_elsewhere() -> None:
        raise Refused

    with pytest.raises(Refused):
        engine.resume(interrupt, {"approved": True}, people["reviewer"], also=used_elsewhere)
    interrupt.refresh_from_db()
    assert interrupt.is_pending and not RunEvent.objects.filter(interrupt=interrupt, kind="approved").exists()


def test_a_decision_before_its_slack_message_is_posted_still_reaches_the_message(
    team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    slack.failures = ["ratelimited"]  # the first post fails, and is retried later
    interrupt = start(team)
    told()
    assert not SlackMessage.objects.exists()
    engine.resume(interrupt, {"approved": True}, people["reviewer"])
    told()
    decided = Notification.objects.get(type="interrupt.decided", channel="slack")
    assert decided.outcome == "pending", "held until the message it updates is posted"
    Notification.objects.filter(outcome="pending").update(next_attempt_at=timezone.now())
    while notify.deliver_due():
        Notification.objects.filter(outcome="pending").update(next_attempt_at=timezone.now())
    posted = slack.called("chat.postMessage")[-1]
    assert not any(b["type"] == "actions" for b in posted["blocks"]), "posted late, as decided"
    assert "*Approved* by reviewer1" in str(slack.called("chat.update")[-1]["blocks"])
    assert set(Notification.objects.filter(channel="slack").values_list("outcome", flat=True)) == {
        "delivered"
    }


def test_a_cancelled_runs_message_says_so_and_a_missing_channel_is_not_retried(
    team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team)
    told()
    engine.cancel(interrupt.run, people["reviewer"])
    told()
    assert "*Cancelled* by reviewer1" in str(slack.called("chat.update")[-1]["blocks"])

    slack.failures = ["channel_not_found"]
    start(team)
    told()
    failed = Notification.objects.filter(channel="slack").latest("pk")
    assert failed.outcome == "skipped"
    assert (
        failed.delivery_attempts.get().error == "not sent: Slack said channel_not_found, which no retry mends"
    )


def test_a_comment_that_mentions_someone_sends_them_a_slack_direct_message_too(
    team: Team, people: dict[str, User], slack: SlackServer
) -> None:
    interrupt = start(team)
    told()
    slack.add_user("U2", "reviewer2@example.com")
    engine.comment(interrupt, "@reviewer2 is <this> the *right* amount?\nsee INV-7", people["reviewer"])
    told()
    (direct,) = [m for m in slack.called("chat.postMessage") if m.get("channel") == "U2"]
    assert direct["text"] == (
        f"reviewer1 mentioned you on <http://testserver/interrupts/{interrupt.pk}/"
        "|Approve sending the invoice?>:\n"
        "> @reviewer2 is &lt;this&gt; the *right* amount?\n> see INV-7"
    )
    assert not any(m.get("channel") == "U1" for m in slack.called("chat.postMessage")), "nobody else"
