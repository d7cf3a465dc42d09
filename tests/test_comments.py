"""The discussion of an interrupt: members of its teams comment, before and after it is decided;
each comment is in the run's event log (the transcript and the audit); @mentions of members are
told by mail. (Live for everyone viewing it: tests/integration/browser/test_working_surface.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client

from actions import engine, notify
from actions.models import Comment, Interrupt, Run, RunEvent, Team

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _links_point_here(settings: Any) -> None:
    settings.GRUNDLAG_BASE_URL = "http://testserver"


def start(team: Team) -> Interrupt:
    run = engine.start_run(
        "send_invoice", {"invoice_id": "INV-5", "amount": 50}, team, None, Run.Consumer.API
    )
    return run.interrupts.get()


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_member_comments_and_it_is_on_the_page_in_the_transcript_and_the_event_log(
    team: Team, reviewer: User
) -> None:
    it = start(team)
    client = logged_in(reviewer)
    response = client.post(f"/interrupts/{it.pk}/comments/", {"body": "  Is INV-5 <b>the</b> right one?\n"})
    assert response.status_code == 302 and response["Location"] == f"/interrupts/{it.pk}/#comments-{it.pk}"
    page = client.get(f"/interrupts/{it.pk}/").content.decode()
    assert "Is INV-5 &lt;b&gt;the&lt;/b&gt; right one?" in page  # text, not markup
    (made,) = Comment.objects.filter(interrupt=it)
    assert (made.author, made.body) == (reviewer, "Is INV-5 <b>the</b> right one?")
    event = RunEvent.objects.get(run=it.run_id, kind=RunEvent.Kind.COMMENTED)
    assert (event.actor, event.interrupt_id) == (reviewer, it.pk)
    assert event.detail == {"comment": made.pk, "body": "Is INV-5 <b>the</b> right one?", "mentions": []}
    assert "Comment by <strong>reviewer1</strong>" in client.get(f"/runs/{it.run_id}/").content.decode()
    # The thread alone, as a push refetches it.
    thread = client.get(f"/interrupts/{it.pk}/comments/", headers={"HX-Request": "true"}).content.decode()
    assert thread.lstrip().startswith(f'<ol id="comment-list-{it.pk}"') and "right one?" in thread
    # Still open once decided: the discussion may go on.
    engine.resume(it, {"approved": True}, reviewer)
    assert client.post(f"/interrupts/{it.pk}/comments/", {"body": "sent, thanks"}).status_code == 302
    assert Comment.objects.filter(interrupt=it).count() == 2


def test_an_empty_or_too_long_comment_or_one_from_outside_the_team_is_refused_and_nothing_is_kept(
    team: Team, reviewer: User, outsider: User, auditor: User
) -> None:
    it = start(team)
    client = logged_in(reviewer)
    empty = client.post(f"/interrupts/{it.pk}/comments/", {"body": "   "})
    assert empty.status_code == 422 and "Write something first." in empty.content.decode()
    long = client.post(f"/interrupts/{it.pk}/comments/", {"body": "x" * 5001})
    assert long.status_code == 422 and "At most 5000 characters (this one has 5001)." in long.content.decode()
    assert 'maxlength="5000"' in long.content.decode() and "x" * 5001 in long.content.decode(), "kept to fix"
    nul = client.post(f"/interrupts/{it.pk}/comments/", {"body": "a\x00b"})
    assert nul.status_code == 422 and "Remove the NUL character." in nul.content.decode()
    htmx = client.post(f"/interrupts/{it.pk}/comments/", {"body": ""}, headers={"HX-Request": "true"})
    assert htmx.status_code == 200 and "Write something first." in htmx.content.decode()
    # Another team's interrupt does not exist for them; a staff auditor reads, not discusses.
    assert logged_in(outsider).post(f"/interrupts/{it.pk}/comments/", {"body": "hi"}).status_code == 404
    refused = logged_in(auditor).post(f"/interrupts/{it.pk}/comments/", {"body": "hi"})
    assert (
        refused.status_code == 403 and "Only members of Finance can discuss this." in refused.content.decode()
    )
    assert 'name="body"' not in logged_in(auditor).get(f"/interrupts/{it.pk}/").content.decode()
    assert not Comment.objects.exists() and not RunEvent.objects.filter(kind=RunEvent.Kind.COMMENTED).exists()


def test_a_comment_tells_pages_of_its_run_and_the_mentioned_without_a_run_change(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    """No run status changed: nobody waiting for one (an API caller's Prefer: wait) is woken."""
    from actions.engine import journal

    it = start(team)
    heard: dict[str, list[dict[str, Any]]] = {"discussed": [], "run_changed": []}

    def hear(name: str) -> Any:
        return lambda sender, **kwargs: heard[name].append(kwargs)

    on_discussed, on_run = hear("discussed"), hear("run_changed")
    journal.discussed.connect(on_discussed)
    journal.run_changed.connect(on_run)
    try:
        engine.comment(it, "@reviewer2 look", reviewer)
    finally:
        journal.discussed.disconnect(on_discussed)
        journal.run_changed.disconnect(on_run)
    assert heard["run_changed"] == []
    assert heard["discussed"] == [
        {"signal": journal.discussed, "run_id": it.run_id, "interrupt_id": it.pk, "mentions": ["reviewer2"]}
    ]


def test_a_mention_mails_the_member_named_and_nobody_else(
    team: Team, reviewer: User, second_reviewer: User, outsider: User
) -> None:
    for user in (reviewer, second_reviewer, outsider):
        user.email = f"{user.username}@example.com"
        user.save()
    it = start(team)
    notify.dispatch()
    mail.outbox.clear()  # the mails of the new approval

    engine.comment(
        it, "@reviewer2 can you check the amount? (not @payroll1, nor @nobody, nor me @reviewer1)", reviewer
    )
    notify.dispatch()
    assert [m.to for m in mail.outbox] == [["reviewer2@example.com"]]
    message = mail.outbox[0]
    assert message.subject == "[Grundlag approvals] reviewer1 mentioned you: Approve sending the invoice?"
    assert "reviewer1 wrote:\n@reviewer2 can you check the amount?" in message.body
    assert f"http://testserver/interrupts/{it.pk}/" in message.body
    html, _ = message.alternatives[0]  # type: ignore[attr-defined]  # an EmailMultiAlternatives
    assert "<strong>reviewer1</strong> wrote:" in html
    assert Comment.objects.get().mentions == ["reviewer2"]

    # A broadcast is not a mention: more than ten people named is refused, nothing kept.
    for n in range(11):
        User.objects.create_user(f"member{n}").teams.add(team)
    everyone = " ".join(f"@member{n}" for n in range(11))
    with pytest.raises(engine.InvalidInput) as refused:
        engine.comment(it, everyone, reviewer)
    assert refused.value.errors[0]["msg"] == "Mention at most 10 people in one comment (this one names 11)."
    assert Comment.objects.count() == 1

    mail.outbox.clear()
    engine.comment(it, "no one named here; mail is for reviewer2@example.com", reviewer)
    notify.dispatch()
    assert mail.outbox == []
