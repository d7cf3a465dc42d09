"""The audit an auditor can rely on: the event log's hash chains (written with each event, and
any tampering in the database named by verify_audit, on SQLite and PostgreSQL), the chain across
a prune, the head published daily, and how each decision was made."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from actions import engine
from actions.engine import audit, journal
from actions.models import AuditAnchor, AuditCheck, AuditHead, Interrupt, Notification, Run, RunEvent, Team

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database")]


def finished_run(team: Team, by: User, invoice: str) -> Run:
    """A run that paused, was approved and completed: six events."""
    run = engine.start_run("send_invoice", {"invoice_id": invoice, "amount": 3.5}, team, by)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True, "comment": "fine — ok"}, by)
    run.refresh_from_db()
    return run


def sql(statement: str, *params: Any) -> None:
    """Straight to the database, as someone with its password would."""
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def problems() -> list[str]:
    return audit.verify().problems


def verify_audit() -> tuple[int, str]:
    import io

    err = io.StringIO()
    try:
        call_command("verify_audit", stdout=io.StringIO(), stderr=err)
    except SystemExit as exit:
        return int(exit.code or 0), err.getvalue()
    return 0, err.getvalue()


@pytest.mark.usefixtures("steps")
def test_every_event_is_chained_as_it_is_logged(team: Team, reviewer: User) -> None:
    runs = [finished_run(team, reviewer, f"C-{n}") for n in range(3)]
    events = list(RunEvent.objects.order_by("seq"))
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert all(len(event.hash) == 64 and len(event.run_hash) == 64 for event in events)
    assert len({event.hash for event in events}) == len(events)
    # The first event of each run starts its own chain from the genesis; the whole log's goes on.
    for run in runs:
        first = RunEvent.objects.filter(run=run).order_by("seq").first()
        assert first is not None
        assert first.run_hash == audit.link("0" * 64, audit._body(first))
    report = audit.verify()
    assert report.ok, report.problems
    assert report.events == len(events) and report.seq == events[-1].seq and report.head == events[-1].hash
    assert verify_audit()[0] == 0
    assert AuditCheck.objects.latest().ok


def test_an_events_hashes_are_what_they_always_were() -> None:
    """The bytes an event's hashes cover, pinned: a change to their format would leave every
    log written before it failing verification (each database writes with audit.rest, which
    verify() recomputes with, so only a fixed value catches it)."""
    at = datetime(2026, 12, 6, 21, 0, 0, 123456, tzinfo=UTC)
    body = audit.content(7, 3, None, "approved", "Zoë ☃", {"b": 1.0, "a": [True, None]}, at)
    assert (
        body
        == b'[7,3,null,"approved","Zo\\u00eb \\u2603",{"a":[true,null],"b":1},"2026-12-06T21:00:00.123456Z"]'
    )
    assert audit.link("0" * 64, body) == hashlib.sha256(b"0" * 64 + body).hexdigest()
    assert audit.link("0" * 64, body) == "d037e1c23e44b44d961da68d0c03fcd9f2719ed46420209c3b21e72ec1065fe8"


@pytest.mark.usefixtures("steps")
def test_events_of_several_runs_and_a_non_ascii_actor_in_one_transaction_verify(team: Team) -> None:
    """As the database chains them (on PostgreSQL a function of its own: migration 0021)."""
    zoe = User.objects.create_user("zoë-☃")
    team.members.add(zoe)
    first, second = finished_run(team, zoe, "Z-1"), finished_run(team, zoe, "Z-2")
    with journal.atomic():
        journal.log(first, RunEvent.Kind.CHECKPOINT_VIEWED, zoe, viewer="Zoë ☃")
        journal.log(second, RunEvent.Kind.CHECKPOINT_VIEWED, zoe, viewer="Zoë ☃")
        journal.log(first, RunEvent.Kind.CHECKPOINT_VIEWED, zoe)
    report = audit.verify()
    assert report.ok, report.problems
    assert RunEvent.objects.filter(actor_name="zoë-☃").count() >= 3


@pytest.mark.usefixtures("steps")
def test_before_migrate_adds_the_journal_function_the_statements_do_its_work(
    team: Team,
    reviewer: User,
    database: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """New processes started before `migrate` (PostgreSQL without migration 0021's function)
    write as the previous release did, and say so, rather than failing every change."""
    from actions.engine import store

    if database != "postgresql":
        assert not store.journal_in_one_call()
        return
    monkeypatch.setattr(store, "_journal_function", {})
    sql("DROP FUNCTION grundlag_append_journal(jsonb, bigint[], bigint[])")  # rolled back with the test
    finished_run(team, reviewer, "M-1")
    assert "no grundlag_append_journal" in caplog.text
    report = audit.verify()
    assert report.ok, report.problems


@pytest.mark.usefixtures("steps")
def test_an_edited_event_is_named(team: Team, reviewer: User) -> None:
    finished_run(team, reviewer, "E-1")
    approved = RunEvent.objects.get(kind="approved")
    sql("UPDATE actions_runevent SET actor_name = %s WHERE id = %s", "someone else", approved.pk)
    code, said = verify_audit()
    assert code == 1
    assert f"event {approved.pk} (place {approved.seq}" in said and "edited" in said
    assert not AuditCheck.objects.latest().ok


@pytest.mark.usefixtures("steps")
def test_an_edited_detail_is_named(team: Team, reviewer: User) -> None:
    finished_run(team, reviewer, "E-2")
    interrupted, resumed = RunEvent.objects.get(kind="interrupted"), RunEvent.objects.get(kind="resumed")
    sql("UPDATE actions_runevent SET detail = '{\"seq\": 9}' WHERE id = %s", interrupted.pk)
    sql("UPDATE actions_runevent SET at = %s WHERE id = %s", resumed.at - timedelta(hours=1), resumed.pk)
    found = problems()
    assert any(f"event {interrupted.pk} " in problem for problem in found), found
    assert any(f"event {resumed.pk} " in problem for problem in found), found


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("actions_interrupt", "decided_by_name", "'someone else'"),
        ("actions_interrupt", "answer", "'{\"approved\": false}'"),
        ("actions_interrupt", "decided_via", "'email'"),
        ("actions_interrupt", "reason", "'made up'"),
        ("actions_interrupt", "edited_arguments", "'{\"amount\": 1}'"),
        ("actions_run", "output", "'{\"sent\": false}'"),
        ("actions_run", "error", "'made up'"),
    ],
)
@pytest.mark.usefixtures("steps")
def test_what_the_audit_shows_edited_in_the_database_is_named(
    team: Team, reviewer: User, table: str, column: str, value: str
) -> None:
    """Who decided, the answer, via, the reason, the edited arguments, a run's output or error:
    edited in the database, verify_audit said "intact" (issue 36)."""
    run = finished_run(team, reviewer, "E-9")
    (interrupt,) = Interrupt.objects.filter(run=run)
    assert problems() == []
    row = interrupt.pk if table == "actions_interrupt" else run.pk
    sql(f"UPDATE {table} SET {column} = {value} WHERE id = %s", row)  # noqa: S608 - the test's own names
    found = problems()
    what = f"interrupt {interrupt.pk}'s decision" if table == "actions_interrupt" else f"run {run.pk}'s end"
    assert any(problem.startswith(what) for problem in found), found
    assert verify_audit()[0] != 0


@pytest.mark.usefixtures("steps")
def test_a_rejection_and_a_cancel_are_covered_too(team: Team, reviewer: User) -> None:
    rejected = engine.start_run("send_invoice", {"invoice_id": "E-10", "amount": 1.0}, team, reviewer)
    (asked,) = engine.pending_interrupts(rejected.pk)
    engine.reject(asked, "no", reviewer)
    cancelled = engine.start_run("send_invoice", {"invoice_id": "E-11", "amount": 1.0}, team, reviewer)
    engine.cancel(cancelled, reviewer)
    assert problems() == []
    sql("UPDATE actions_interrupt SET reason = 'yes' WHERE id = %s", asked.pk)
    sql("UPDATE actions_run SET status = 'completed' WHERE id = %s", cancelled.pk)
    found = problems()
    assert any(problem.startswith(f"interrupt {asked.pk}'s decision") for problem in found), found
    assert any(problem.startswith(f"run {cancelled.pk}'s end") for problem in found), found


@pytest.mark.usefixtures("steps")
def test_a_deleted_event_is_named(team: Team, reviewer: User) -> None:
    run = finished_run(team, reviewer, "D-1")
    resumed = RunEvent.objects.get(kind="resumed")
    sql("DELETE FROM actions_runevent WHERE id = %s", resumed.pk)
    found = problems()
    assert found[0] == f"events {resumed.seq} to {resumed.seq} of the chain are missing: deleted"
    assert any(f"run {run.pk}'s chain breaks" in problem for problem in found)
    assert verify_audit()[0] == 1


@pytest.mark.usefixtures("steps")
def test_the_newest_events_deleted_are_named(team: Team, reviewer: User) -> None:
    finished_run(team, reviewer, "D-2")
    last = RunEvent.objects.order_by("-seq").first()
    assert last is not None
    sql("DELETE FROM actions_runevent WHERE id = %s", last.pk)
    assert f"events {last.seq} to {last.seq} of the chain are missing: the newest were deleted" in problems()


@pytest.mark.usefixtures("steps")
def test_an_event_inserted_directly_is_named(team: Team, reviewer: User) -> None:
    run = finished_run(team, reviewer, "I-1")
    sql(
        "INSERT INTO actions_runevent (run_id, kind, actor_name, detail, at, hash, run_hash)"
        " VALUES (%s, 'approved', 'mallory', '{}', %s, '', '')",
        run.pk,
        timezone.now(),
    )
    forged = RunEvent.objects.get(actor_name="mallory")
    assert (
        f"event {forged.pk} has no place in the chain: it was inserted directly in the database" in problems()
    )


@pytest.mark.usefixtures("steps")
def test_events_reordered_are_named(team: Team, reviewer: User) -> None:
    finished_run(team, reviewer, "R-1")
    first, second = RunEvent.objects.filter(kind__in=["approved", "resumed"]).order_by("seq")
    # Their places swapped (through a free one: seq is unique).
    sql("UPDATE actions_runevent SET seq = -1 WHERE id = %s", first.pk)
    sql("UPDATE actions_runevent SET seq = %s WHERE id = %s", first.seq, second.pk)
    sql("UPDATE actions_runevent SET seq = %s WHERE id = %s", second.seq, first.pk)
    found = problems()
    assert any(f"event {second.pk} (place {first.seq}" in problem for problem in found), found


@pytest.mark.usefixtures("steps")
def test_a_log_rewritten_with_its_hashes_is_caught_by_the_published_head(team: Team, reviewer: User) -> None:
    """Whoever edits an event and recomputes every hash after it fools the chains, not the
    head published before."""
    finished_run(team, reviewer, "P-1")
    published = audit.publish_head()
    assert published is not None and audit.publish_head() is None, "once a day"
    approved = RunEvent.objects.get(kind="approved")
    sql("UPDATE actions_runevent SET actor_name = %s WHERE id = %s", "someone else", approved.pk)
    # Recompute both chains from the edit on, and the head, as a careful forger would.
    head, run_heads = "0" * 64, dict[int, str]()
    for event in RunEvent.objects.order_by("seq"):
        body = audit._body(event)
        head = audit.link(head, body)
        run_heads[event.run_id] = audit.link(run_heads.get(event.run_id, "0" * 64), body)
        sql(
            "UPDATE actions_runevent SET hash = %s, run_hash = %s WHERE id = %s",
            head,
            run_heads[event.run_id],
            event.pk,
        )
    sql("UPDATE actions_auditchain SET head = %s WHERE id = 1", head)
    assert problems() == [
        f"the head published {published.at:%Y-%m-%d %H:%M} UTC (place {published.seq}) is not the log's:"
        " the log was rewritten since"
    ]


@pytest.mark.usefixtures("steps")
def test_the_chain_verifies_across_a_prune_and_the_archive_carries_the_hashes(
    team: Team, reviewer: User, tmp_path: Path
) -> None:
    old = finished_run(team, reviewer, "OLD")
    kept = finished_run(team, reviewer, "KEPT")
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=400))
    old_events = list(RunEvent.objects.filter(run=old).order_by("seq").values_list("seq", "hash"))
    archive = tmp_path / "archive.jsonl"
    call_command("prune_runs", "--older-than-days", "365", "--archive", str(archive))
    assert not Run.objects.filter(pk=old.pk).exists() and Run.objects.filter(pk=kept.pk).exists()
    assert list(AuditAnchor.objects.order_by("seq").values_list("seq", "hash")) == old_events
    report = audit.verify()
    assert report.ok, report.problems
    record = json.loads(archive.read_text())
    assert [(e["seq"], e["hash"]) for e in record["events"]] == old_events
    # What was pruned can still be checked, from the archive, against the chain that remains.
    hashes = dict(AuditAnchor.objects.values_list("seq", "hash")) | dict(
        RunEvent.objects.values_list("seq", "hash")
    )
    for event in record["events"]:
        body = audit.content(
            event["seq"], record["id"], event["interrupt"], event["kind"], event["actor"], event["detail"],
            datetime.fromisoformat(event["at"]),
        )  # fmt: skip
        assert audit.link(hashes.get(event["seq"] - 1, "0" * 64), body) == event["hash"]
    # A later edit of a kept event is still found.
    sql("UPDATE actions_runevent SET kind = 'rejected' WHERE run_id = %s AND kind = 'approved'", kept.pk)
    assert not audit.verify().ok


@pytest.mark.usefixtures("steps")
def test_the_head_is_published_daily_to_the_log_the_admin_and_subscribed_webhooks(
    team: Team, reviewer: User, caplog: pytest.LogCaptureFixture
) -> None:
    from actions.models import Webhook

    finished_run(team, reviewer, "H-1")
    hook = Webhook.objects.create(team=team, url="https://hooks.example.com/a", events=["audit.head"])
    Webhook.objects.create(team=team, url="https://hooks.example.com/b", events=["run.finished"])
    with caplog.at_level("INFO", logger="actions.engine.audit"):
        audit.daily()
    published = AuditHead.objects.get()
    last = RunEvent.objects.order_by("-seq").first()
    assert last is not None and (published.seq, published.head) == (last.seq, last.hash)
    assert f"audit chain head published: place {last.seq}, sha256 {last.hash}" in caplog.text
    (told,) = Notification.objects.filter(type="audit.head")
    assert told.webhook_id == hook.pk and told.payload["data"] == {
        "seq": last.seq,
        "head": last.hash,
        "algorithm": "sha256",
    }
    assert AuditCheck.objects.latest().ok, "the daily round verifies too"
    audit.daily()
    assert AuditHead.objects.count() == 1, "not again within the day"
    AuditHead.objects.update(at=timezone.now() - timedelta(days=1, minutes=1))
    audit.daily()
    assert AuditHead.objects.count() == 2


@pytest.mark.usefixtures("steps")
def test_each_decision_says_how_it_was_made(team: Team, reviewer: User, token_key: str) -> None:
    by_page = engine.start_run("send_invoice", {"invoice_id": "V-1", "amount": 1}, team, reviewer)
    client = Client()
    client.force_login(reviewer)
    (first,) = engine.pending_interrupts(by_page.pk)
    assert client.post(f"/interrupts/{first.pk}/approve/", {"approved": "on"}).status_code in (200, 302)
    by_api = engine.start_run("send_invoice", {"invoice_id": "V-2", "amount": 1}, team, reviewer)
    (second,) = engine.pending_interrupts(by_api.pk)
    response = client.post(
        f"/api/interrupts/{second.pk}/reject",
        json.dumps({"error": "no"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token_key}"},
    )
    assert response.status_code in (200, 202), response.content
    by_bulk = engine.start_run("send_invoice", {"invoice_id": "V-3", "amount": 1}, team, reviewer)
    (third,) = engine.pending_interrupts(by_bulk.pk)
    engine.reject(third, "batch", reviewer, via="bulk")
    vias = dict(Interrupt.objects.values_list("pk", "decided_via"))
    assert (vias[first.pk], vias[second.pk], vias[third.pk]) == ("dashboard", "api", "bulk")


@pytest.mark.usefixtures("steps")
def test_what_the_databases_give_back_differently_still_verifies(team: Team, reviewer: User) -> None:
    """Floats without a fraction beyond 2**53 (PostgreSQL's jsonb reads 1e23 back as 10**23),
    keys that JSON writes as text, unicode; and a user deleted (the event keeps the name)."""
    from actions.engine.journal import log

    run = finished_run(team, reviewer, "F-1")
    log(
        run,
        RunEvent.Kind.COMMENTED,
        reviewer,
        None,
        big=1e23,
        power=2.0**70,
        small=0.1,
        keyed={None: 1, 2: "x"},
    )
    log(run, RunEvent.Kind.COMMENTED, None, None, body="Zoë — 東京 \u2028", nested=[[1.0, {"a": -0.0}]])
    reviewer.delete()
    report = audit.verify()
    assert report.ok, report.problems
    assert RunEvent.objects.filter(actor_name="reviewer1", actor__isnull=True).exists()


@pytest.mark.usefixtures("steps")
def test_a_head_held_outside_catches_a_rewrite_of_the_log_and_its_published_heads(
    team: Team, reviewer: User
) -> None:
    finished_run(team, reviewer, "O-1")
    last = RunEvent.objects.order_by("-seq").first()
    assert last is not None
    outside = (int(last.seq or 0), last.hash)  # as a webhook receiver got it
    sql("UPDATE actions_runevent SET actor_name = 'someone else' WHERE id = %s", last.pk)
    head = "0" * 64
    for event in RunEvent.objects.order_by("seq"):
        head = audit.link(head, audit._body(event))
        sql("UPDATE actions_runevent SET hash = %s, run_hash = %s WHERE id = %s", head, head, event.pk)
    sql("UPDATE actions_auditchain SET head = %s WHERE id = 1", head)
    assert any("published outside the database" in problem for problem in audit.verify([outside]).problems)
    code, said = verify_audit_with("--head", f"{outside[0]}:{outside[1]}")
    assert code == 1 and "outside the database" in said
    assert verify_audit_with("--head", "12:nothex")[0] == 2


def verify_audit_with(*args: str) -> tuple[int, str]:
    import io

    from django.core.management.base import CommandError

    err = io.StringIO()
    try:
        call_command("verify_audit", *args, stdout=io.StringIO(), stderr=err)
    except CommandError as exc:
        return 2, str(exc)
    except SystemExit as exit:
        return int(exit.code or 0), err.getvalue()
    return 0, err.getvalue()


@pytest.mark.usefixtures("steps")
def test_anchors_written_without_a_prune_are_not_backed_by_its_archive(
    team: Team, reviewer: User, tmp_path: Path
) -> None:
    pruned = finished_run(team, reviewer, "A-1")
    hidden = finished_run(team, reviewer, "A-2")
    finished_run(team, reviewer, "A-3")
    Run.objects.filter(pk=pruned.pk).update(finished_at=timezone.now() - timedelta(days=400))
    archive = tmp_path / "archive.jsonl"
    call_command("prune_runs", "--older-than-days", "365", "--archive", str(archive))
    assert verify_audit_with("--archive", str(archive))[0] == 0
    # Someone deletes a run and writes anchors for its events, as a prune would have.
    for seq, hash_ in RunEvent.objects.filter(run=hidden).values_list("seq", "hash"):
        AuditAnchor.objects.create(seq=int(seq or 0), run_id=hidden.pk, hash=hash_)
    sql("DELETE FROM actions_runevent WHERE run_id = %s", hidden.pk)
    assert audit.verify().ok, "the chains alone take the anchors at their word"
    code, said = verify_audit_with("--archive", str(archive))
    assert code == 1 and "have no event in the archive" in said
