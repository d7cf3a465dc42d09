"""The audit history: who sees what (staff everything, members their teams' decided history, on
the page, the exports and the API), filters and full-text search on both databases, keyset
pages, complete exports (CSV and JSON Lines, interrupts and events, each recorded), decision
times, reviewers and deadlines, retention."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions import engine
from actions.engine.rules import PLAIN_APPROVAL
from actions.models import Interrupt, Run, RunEvent, Team
from tests.search import plant

pytestmark = pytest.mark.django_db


def staff(auditor: User) -> Client:
    client = Client()
    client.force_login(auditor)
    return client


def bulk_history(team: Team, count: int, **extra: Any) -> list[Interrupt]:
    """Many decided interrupts, written directly: history is what is being read here."""
    now = timezone.now()
    runs = Run.objects.bulk_create(
        [
            Run(action="send_invoice", team=team, status="completed", input={}, finished_at=now)
            for _ in range(count)
        ]
    )
    interrupts = []
    for i, run in enumerate(runs):
        paused = now - timedelta(minutes=i + 10)
        interrupts.append(
            Interrupt(
                run=run,
                seq=1,
                team=team,
                action=extra.get("action", "send_invoice"),
                message=f"Approve invoice {i}?",
                status="approved",
                decided_by_name=extra.get("decided_by", "reviewer1"),
                created_at=paused,
                decided_at=paused + timedelta(minutes=i % 10 + 1),  # 1 to 10 minutes to decide
            )
        )
    return Interrupt.objects.bulk_create(interrupts)


def test_a_member_reads_their_own_teams_decided_history_only(
    team: Team, other_team: Team, reviewer: User, token_key: str, other_token_key: str
) -> None:
    bulk_history(team, 3)
    bulk_history(other_team, 2, decided_by="payroll1")
    engine.start_run("send_invoice", {"invoice_id": "PENDING-1", "amount": 1}, team, reviewer)
    assert Client().get("/history/").status_code == 302, "signed in only"
    client = Client()
    client.force_login(reviewer)
    page = client.get("/history/")
    assert page.status_code == 200
    assert {it.team.slug for it in page.context["rows"]} == {"finance"}
    assert len(page.context["rows"]) == 3, "decided only: the pending one is the inbox's"
    assert client.get("/history/", {"team": "payroll"}).status_code == 403
    for path in ("/history/export.csv", "/history/export.jsonl", "/history/events.csv"):
        assert client.get(path, {"team": "payroll"}).status_code == 403, path
    body = b"".join(client.get("/history/export.jsonl").streaming_content).decode()  # type: ignore[attr-defined]
    assert {json.loads(line)["team"] for line in body.splitlines()} == {"finance"}
    assert len(body.splitlines()) == 3

    api = {"Authorization": f"Bearer {token_key}"}
    items = client.get("/api/history", headers=api).json()["items"]
    assert {item["team"] for item in items} == {"finance"} and len(items) == 3
    refused = client.get("/api/history", {"team": "payroll"}, headers=api)
    assert refused.status_code == 403 and "own team" in refused.json()["detail"]
    other = client.get("/api/history", headers={"Authorization": f"Bearer {other_token_key}"}).json()
    assert {item["team"] for item in other["items"]} == {"payroll"}
    from actions.models import AuditExport

    read = AuditExport.objects.filter(format="api").order_by("at", "id")
    assert [(export.user_name, export.filters.get("teams")) for export in read] == [
        ("API token ci", [team.pk]),
        ("API token payroll-ci", [other_team.pk]),
    ], "each read through the API is recorded, as an export is"
    # A filter's bad value is refused, not read as no filter (the page shows it empty instead).
    for bad in ({"until": "0"}, {"since": "2026-12-06T10:00:00"}, {"status": "eaten"}, {"run": "x"}):
        response = client.get("/api/history", bad, headers=api)
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] in bad, bad
    assert len(client.get("/api/history", {"since": "2000-01-01"}, headers=api).json()["items"]) == 3


def test_history_pages_by_keyset_with_a_fixed_number_of_queries(
    team: Team, auditor: User, django_assert_max_num_queries: Any
) -> None:
    bulk_history(team, 120)
    client = staff(auditor)
    with django_assert_max_num_queries(12):
        first = client.get("/history/")
    page = first.content.decode()
    assert page.count("<td><code>send_invoice</code></td>") == 50
    assert "Approve invoice 0?" in page and "Approve invoice 50?" not in page
    cursor = first.context["next_cursor"]
    with django_assert_max_num_queries(12):
        second = client.get("/history/", {"after": cursor})
    assert "Approve invoice 50?" in second.content.decode()
    third = client.get("/history/", {"after": second.context["next_cursor"]})
    assert third.context["next_cursor"] == "" and len(third.context["rows"]) == 20


def test_history_filters_by_team_status_decider_and_text(team: Team, other_team: Team, auditor: User) -> None:
    bulk_history(team, 5)
    bulk_history(other_team, 3, decided_by="payroll1", action="transfer_funds")
    client = staff(auditor)
    assert len(client.get("/history/", {"team": "payroll"}).context["rows"]) == 3
    assert len(client.get("/history/", {"decided_by": "reviewer1"}).context["rows"]) == 5
    assert (
        len(client.get("/history/", {"action": "transfer_funds", "status": "approved"}).context["rows"]) == 3
    )
    assert len(client.get("/history/", {"q": "invoice 4"}).context["rows"]) == 1
    assert len(client.get("/history/", {"status": "pending"}).context["rows"]) == 0
    # The day of the newest row, as the page reads dates (not "today": a few minutes after
    # midnight, every row was made the day before).
    day = timezone.localdate(Interrupt.objects.latest("created_at").created_at).isoformat()
    assert len(client.get("/history/", {"since": day, "until": day}).context["rows"]) >= 1


def test_decision_times_show_median_and_p90_per_action(team: Team, auditor: User) -> None:
    cache.clear()
    bulk_history(team, 10)  # decided after 1..10 minutes
    page = staff(auditor).get("/history/").content.decode()
    assert "median 6 min · p90 10 min · 10" in page
    assert "<svg" in page and 'class="median"' in page


def test_the_csv_export_streams_the_filtered_history(team: Team, other_team: Team, auditor: User) -> None:
    bulk_history(team, 30)
    bulk_history(other_team, 2)
    response = staff(auditor).get("/history/export.csv", {"team": "finance"})
    assert response.streaming and response["Content-Type"] == "text/csv; charset=utf-8"
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    rows = list(csv.reader(io.StringIO(body)))
    assert rows[0][:4] == ["interrupt_id", "run_id", "seq", "team"]
    assert len(rows) == 31 and {row[3] for row in rows[1:]} == {"finance"}


def test_each_history_row_links_to_its_run_transcript(team: Team, auditor: User, reviewer: User) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "H-1", "amount": 1}, team, reviewer)
    page = staff(auditor).get("/history/").content.decode()
    assert f'<a href="/runs/{run.pk}/">#{run.pk}</a>' in page
    assert staff(auditor).get(f"/runs/{run.pk}/").status_code == 200


def test_retention_deletes_old_finished_runs_and_never_pending_ones(team: Team, tmp_path: Path) -> None:
    old = timezone.now() - timedelta(days=400)
    finished = engine.start_run("send_invoice", {"invoice_id": "OLD", "amount": 1}, team, None)
    engine.reject(finished.interrupts.get(), "no", None)
    Run.objects.filter(pk=finished.pk).update(finished_at=old)
    waiting = engine.start_run("send_invoice", {"invoice_id": "WAIT", "amount": 1}, team, None)
    Run.objects.filter(pk=waiting.pk).update(created_at=old)
    recent = engine.start_run("send_invoice", {"invoice_id": "NEW", "amount": 1}, team, None)
    engine.reject(recent.interrupts.get(), "no", None)

    call_command("prune_runs", "--older-than-days", "365", "--dry-run")
    assert Run.objects.count() == 3
    archive = tmp_path / "archive.jsonl"
    call_command("prune_runs", "--older-than-days", "365", "--archive", str(archive))
    assert set(Run.objects.values_list("pk", flat=True)) == {waiting.pk, recent.pk}
    assert not RunEvent.objects.filter(run_id=finished.pk).exists()
    record = json.loads(archive.read_text())
    assert record["id"] == finished.pk and record["interrupts"][0]["reason"] == "no"
    assert [e["kind"] for e in record["events"]][:3] == ["started", "claimed", "interrupted"]


@pytest.mark.usefixtures("database")
def test_a_members_pages_hold_their_teams_and_what_was_escalated_to_them_in_order(
    team: Team, other_team: Team, reviewer: User, token_key: str
) -> None:
    # A page of a member's view is read as two lists, each newest first by its own index (their
    # team's, and those escalated to it), merged (history._visible): every page must still be
    # the view's rows in order, whichever list they come from, however the pages fall.
    ours = bulk_history(team, 70)
    theirs = bulk_history(other_team, 90, decided_by="payroll1")
    now = timezone.now()
    escalated = theirs[::3]  # interleaved in time with the team's own
    Interrupt.objects.filter(pk__in=[it.pk for it in escalated]).update(escalate_to=team, escalated_at=now)
    Interrupt.objects.filter(pk=theirs[1].pk).update(escalate_to=team)  # due, never escalated
    expected = sorted(ours + escalated, key=lambda it: (it.created_at, it.pk), reverse=True)
    assert len(expected) == 100

    client = Client()
    client.force_login(reviewer)
    found, after = [], ""
    while True:
        response = client.get("/history/", {"after": after})
        found += [row.pk for row in response.context["rows"]]
        if not (after := response.context["next_cursor"]):
            break
    assert found == [it.pk for it in expected]

    api = {"Authorization": f"Bearer {token_key}"}
    found, after = [], ""
    while True:
        body = client.get("/api/history", {"after": after} if after else {}, headers=api).json()
        found += [item["interrupt_id"] for item in body["items"]]
        if not (after := body["next"] or ""):
            break
    assert found == [it.pk for it in expected]
    # Searched, the same: "7" is in the invoice numbers of both teams' rows.
    text = "invoice 7"
    searched = client.get("/history/", {"q": text}).context["rows"]
    every = [it for it in expected if any(word == "7" for word in it.message.strip("?").split())]
    assert [row.pk for row in searched] == [it.pk for it in every][:50] and every


def test_the_periodic_round_keeps_sqlites_planner_statistics(team: Team) -> None:
    from actions.engine import store

    if connection.vendor != "sqlite":
        assert store.refresh_statistics() is False
        return
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS sqlite_stat1")
    assert store.refresh_statistics() is True, "never made"
    assert store.refresh_statistics() is False, "made, and nothing changed"
    bulk_history(team, 1200)
    assert store.refresh_statistics() is True, "the interrupts more than doubled"
    with connection.cursor() as cursor:
        cursor.execute("SELECT stat FROM sqlite_stat1 WHERE idx = 'interrupt_team_created'")
        (stat,) = cursor.fetchone()
    assert int(stat.split()[0]) >= 1000, "a sample (analysis_limit): about the rows there are"
    Interrupt.objects.filter(pk__in=Interrupt.objects.values("pk")[:1000]).delete()
    assert store.refresh_statistics() is True, "retention took most of them"
    assert store.refresh_statistics() is False, "made again, and steady"


# Search: what was asked and answered, by the database's full-text index, on both databases.


@pytest.mark.usefixtures("database", "steps")
def test_search_finds_what_was_asked_answered_and_said(team: Team, reviewer: User, auditor: User) -> None:
    asked = engine.start_run("send_invoice", {"invoice_id": "INV-2024-0117", "amount": 12.5}, team, reviewer)
    (question,) = engine.pending_interrupts(asked.pk)
    engine.resume(question, {"approved": True, "comment": "Checked with Zoë Müller"}, reviewer)
    refused = engine.start_run("send_invoice", {"invoice_id": "INV-2024-0999", "amount": 3}, team, reviewer)
    (other,) = engine.pending_interrupts(refused.pk)
    engine.reject(other, "duplicate of the October batch", reviewer)
    # One whose run's input holds what its question does not.
    quiet = Run.objects.create(
        action="send_invoice", team=team, status="completed", input={"customer": "Zebulon"}
    )
    Interrupt.objects.create(run=quiet, seq=1, team=team, action="send_invoice", message="Approve?", data={})

    client = staff(auditor)

    def found(text: str) -> set[int]:
        return {it.run_id for it in client.get("/history/", {"q": text}).context["rows"]}

    assert found("INV-2024-0117") == {asked.pk}, "in the data (and the input)"
    assert found("Müller") == {asked.pk} and found("Zoë") == {asked.pk}, "in the answer"
    assert found("October") == {refused.pk}, "in the reason"
    assert found("Zebulon") == {quiet.pk}, "in the run's input"
    assert found("invoice approve") == {asked.pk, refused.pk}, "every word, in any field"
    assert found("INV-2024-0117 October") == set(), "every word"
    assert found('"; DROP TABLE') == set() and found("NEAR( a b )") == set(), (
        "the user's words, not the syntax"
    )
    assert {it.run_id for it in client.get("/history/", {"run": asked.pk}).context["rows"]} == {asked.pk}
    assert client.get("/history/", {"run": "x1"}).context["rows"] == []
    assert {it.run_id for it in client.get("/history/", {"decided_by": "reviewer1"}).context["rows"]} == {
        asked.pk,
        refused.pk,
    }


@pytest.mark.usefixtures("database")
def test_a_decision_writes_the_search_document_again_only_when_its_words_change(
    team: Team, reviewer: User, auditor: User
) -> None:
    """The trigger that keeps an interrupt's document skips a decision that adds no word (an
    answer of true or false, no reason): seen here by a word planted in the stored document,
    which a rewrite would drop."""
    client = staff(auditor)

    def found(text: str) -> set[int]:
        return {it.pk for it in client.get("/history/", {"q": text}).context["rows"]}

    def asked(invoice: str) -> Interrupt:
        run = engine.start_run("send_invoice", {"invoice_id": invoice, "amount": 7}, team, reviewer)
        (interrupt,) = engine.pending_interrupts(run.pk)
        plant(interrupt.pk)
        return interrupt

    untouched = asked("INV-A")
    engine.resume(untouched, {"approved": True, "final": False, "note": None}, reviewer)
    plain = asked("INV-P")
    engine.resume(plain, PLAIN_APPROVAL, reviewer)  # the dashboard's, mail's, Slack's approval
    nothing = asked("INV-N")
    engine.resume(nothing, None, reviewer)
    assert found("Planted") == {untouched.pk, plain.pk, nothing.pk}, (
        "true, false, null and an empty comment are no words: nothing to write"
    )
    assert found("INV-A") == set()

    with_reason = asked("INV-B")
    engine.reject(with_reason, "a duplicate", reviewer)
    with_words = asked("INV-C")
    engine.resume(with_words, {"approved": True, "comment": "paid by Quentin"}, reviewer)
    with_number = asked("INV-D")
    engine.resume(with_number, {"approved": True, "amount": 4711}, reviewer)
    assert found("Planted") == {untouched.pk, plain.pk, nothing.pk}, "each of the others was written again"
    assert found("duplicate INV-B") == {with_reason.pk}
    assert found("Quentin INV-C") == {with_words.pk}
    assert found("4711 INV-D") == {with_number.pk}

    # Its data changed (an edit by hand, or a migration's): written again too.
    plant(untouched.pk)
    Interrupt.objects.filter(pk=untouched.pk).update(data={"invoice_id": "INV-A2"})
    assert found("INV-A2") == {untouched.pk} and found("Planted") == {plain.pk, nothing.pk}


@pytest.mark.usefixtures("database")
def test_an_answer_of_more_words_than_a_document_holds_is_decided(
    team: Team, reviewer: User, auditor: User, settings: Any
) -> None:
    """With the payload limit raised past PostgreSQL's tsvector limit (1 MB), the decision is
    stored and its document made of what fits, as before the trigger compared answers."""
    settings.GRUNDLAG_MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
    run = engine.start_run("send_invoice", {"invoice_id": "INV-BIG", "amount": 1}, team, reviewer)
    (interrupt,) = engine.pending_interrupts(run.pk)
    words = " ".join(f"w{n:07d}" for n in range(160_000))  # 1.4 MB of distinct words
    engine.resume(interrupt, {"approved": True, "comment": f"Zanzibar {words}"}, reviewer)
    interrupt.refresh_from_db()
    assert interrupt.status == "approved"
    rows = staff(auditor).get("/history/", {"q": "Zanzibar INV-BIG"}).context["rows"]
    assert [row.pk for row in rows] == [interrupt.pk]


@pytest.mark.usefixtures("database", "steps")
def test_a_comment_is_searchable(team: Team, reviewer: User, auditor: User) -> None:
    run = engine.start_run("send_invoice", {"invoice_id": "C-1", "amount": 1}, team, reviewer)
    (it,) = engine.pending_interrupts(run.pk)
    client = Client()
    client.force_login(reviewer)
    assert client.post(
        f"/interrupts/{it.pk}/comments/", {"body": "the Quokka order is disputed"}
    ).status_code in (
        200,
        302,
    )
    engine.reject(it, "no", reviewer)
    rows = staff(auditor).get("/history/", {"q": "quokka"}).context["rows"]
    assert [row.pk for row in rows] == [it.pk]


@pytest.mark.usefixtures("database")
def test_a_page_of_search_results_is_the_same_whichever_plan_reads_it(
    team: Team, auditor: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On SQLite a page is read by the matches' ids when they are few, by walking the history's
    # index when most rows hold the words, and by looking the matches up otherwise
    # (store._plan); every plan must find the same rows.
    from actions.engine import store
    from actions.reads.history import filtered

    written = bulk_history(team, 120)
    client = staff(auditor)

    def pages(text: str) -> list[list[int]]:
        found, after = [], ""
        while True:
            response = client.get("/history/", {"q": text, "after": after})
            found.append([row.pk for row in response.context["rows"]])
            after = response.context["next_cursor"]
            if not after:
                return found

    texts = ("invoice", "invoice 7", "approve 119")
    few = {text: pages(text) for text in texts}
    newest_first = sorted(written, key=lambda it: (it.created_at, it.pk), reverse=True)
    assert sum(few["invoice"], []) == [it.pk for it in newest_first]
    assert [len(page) for page in few["invoice"]] == [50, 50, 20]
    assert few["invoice 7"] == [[written[7].pk]] and few["approve 119"] == [[written[119].pk]]
    sqlite = connection.vendor == "sqlite"
    if sqlite:
        # Fewer than _FEW matches are few; as many may have more.
        assert store._plan('"invoice"', 51).few is not None, "120 matches are few"
        monkeypatch.setattr(store, "_FEW", 121)
        assert store._plan('"invoice"', 51).few is not None
        monkeypatch.setattr(store, "_FEW", 120)
        assert store._plan('"invoice"', 51).few is None
    # Never few: looked up, as asking FTS5 of each row costs more.
    monkeypatch.setattr(store, "_FEW", 0)
    if sqlite:
        assert store._plan('"invoice"', 51) == store._Plan() == store._plan('"approve" "119"', 51)
    assert {text: pages(text) for text in texts} == few
    # Asking FTS5 about a row made (nearly) free: walking pays for any word most rows hold.
    monkeypatch.setattr(store, "_ASK_US", store._ID_US / 1000)
    if sqlite:
        assert store._plan('"invoice"', 51).budget and not store._plan('"approve" "119"', 51).budget
    assert {text: pages(text) for text in texts} == few
    looked_up = few
    # What the figures and the exports read (every match) is the same set.
    every, _ = filtered({"q": "invoice"}, None)
    assert sorted(every.values_list("pk", flat=True)) == sorted(sum(looked_up["invoice"], []))


@pytest.mark.usefixtures("database")
def test_a_members_search_pages_are_the_same_whichever_plan_reads_them(
    team: Team, other_team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A member's page of a search walks their two lists (their team's, those escalated to it),
    # asking FTS5 of each row, where that pays (store.first_matching); it looks the matches up
    # when it does not, and when the walks' budget ends before their page (a word common in the
    # history and rare in the team's rows). Every plan must find the same pages, filtered or not,
    # the lists apart or overlapping.
    from actions.engine import store

    ours = bulk_history(team, 140)
    theirs = bulk_history(other_team, 130, decided_by="payroll1")
    escalated = theirs[::4]
    Interrupt.objects.filter(pk__in=[it.pk for it in escalated]).update(
        escalate_to=team, escalated_at=timezone.now()
    )
    # "payroll": in every row of the other team's, and in one of the team's own, far down.
    Interrupt.objects.filter(team=other_team).update(message="Approve payroll run?")
    Interrupt.objects.filter(pk=ours[120].pk).update(message="Approve payroll for Kim?")
    # "even": in two of every three of the team's rows: a page fills part way into a chunk.
    Interrupt.objects.filter(pk__in=[it.pk for n, it in enumerate(ours) if n % 3]).update(
        message="Approve even invoice?"
    )
    Interrupt.objects.filter(pk__in=[it.pk for it in ours[::5]]).update(status="rejected")
    client = Client()
    client.force_login(reviewer)

    def pages(query: dict[str, str]) -> list[list[int]]:
        found, after = [], ""
        while True:
            response = client.get("/history/", {**query, "after": after})
            found.append([row.pk for row in response.context["rows"]])
            if not (after := response.context["next_cursor"]):
                return found

    searches = [
        {"q": text} for text in ("invoice", "invoice 9", "payroll", "approve", "approve 69", "even")
    ] + [{"q": "approve", "status": "rejected"}, {"q": "approve", "decided_by": "payroll1"}]

    def every_page() -> list[list[list[int]]]:
        return [pages(query) for query in searches]

    # The matches are few (fewer than store._FEW): every page is read by their ids, as found
    # in choosing. Never few: a walk, or a lookup.
    few = every_page()
    monkeypatch.setattr(store, "_FEW", 0)
    looked_up = every_page()
    assert looked_up == few
    # An invoice's number: the team's row alone (the other team's say "payroll", and two of
    # every three of the team's "even").
    assert looked_up[1] == [[ours[9].pk]] and looked_up[4] == [[ours[69].pk]]
    newest_first = sorted(ours + escalated, key=lambda it: (it.created_at, it.pk), reverse=True)
    approve = looked_up[3]
    assert sum(approve, []) == [it.pk for it in newest_first]
    assert [len(page) for page in approve] == [50, 50, 50, 23]
    assert sum(looked_up[2], []) == [it.pk for it in newest_first if it.pk == ours[120].pk or it in escalated]
    assert sum(looked_up[7], []) == [it.pk for it in newest_first if it in escalated], "filtered"

    # A word said twice is asked once (FTS5 folds case); a search of many words, as FTS5 splits
    # them, is looked up, never walked (a walk asks FTS5 the whole query once a chunk), and
    # without counting its matches.
    assert store._fts_query("invoice Invoice invoice") == '"invoice"'
    many_words = (
        " ".join(f"word{n}" for n in range(store._WALKED_WORDS + 1)),
        ".".join(f"w{n}" for n in range(store._WALKED_WORDS + 1)),  # one "word" to str.split
    )
    with monkeypatch.context() as never_few:
        never_few.setattr(store, "_FEW", 0)
        for many in many_words if connection.vendor == "sqlite" else ():  # FTS5's
            fts = store._fts_query(many)
            with CaptureQueriesContext(connection) as asked:
                assert fts is not None and store._plan(fts, 51) == store._Plan()
            assert len(asked.captured_queries) == 1, "its first matches, no count"

    outcomes: list[bool] = []
    walk = store.first_matching

    def first_matching(*args: Any) -> Any:
        found = walk(*args)
        outcomes.append(isinstance(found, list))  # walked; otherwise the matches to read from
        return found

    monkeypatch.setattr(store, "first_matching", first_matching)
    # Asking FTS5 about a row made (nearly) free: a walk pays for any word more than a few rows
    # hold, and reads its lists to their ends.
    with monkeypatch.context() as free:
        free.setattr(store, "_ASK_US", store._ID_US / 1000)
        for query, expected in zip(searches, looked_up, strict=True):
            outcomes.clear()
            assert pages(query) == expected, query
            if connection.vendor == "sqlite":
                # An invoice's number is in a row or two: a walk does not pay, they are looked up.
                assert outcomes and all(outcomes) == (query["q"] not in ("invoice 9", "approve 69")), query
        # A member of the other team too: a row of theirs escalated to the team is in both lists.
        other_team.members.add(reviewer)
        both = [pages(query) for query in searches]
    assert both == every_page()
    assert both != looked_up and sum(both[2], []) == [
        it.pk for it in sorted([ours[120], *theirs], key=lambda it: (it.created_at, it.pk), reverse=True)
    ]
    other_team.members.remove(reviewer)
    # The walks allowed two pages' length of rows in all, fewer than the team's rows: "approve"
    # finds the team's page in its first chunk, and the escalated ones (33) in what is left;
    # "payroll" is not among the team's newest 102, so the walk cannot tell and the matches are
    # looked up.
    monkeypatch.setattr(store, "_plan", lambda query, newest: store._Plan(budget=2 * newest))
    for query, expected in zip(searches, looked_up, strict=True):
        outcomes.clear()
        assert pages(query) == expected, query
        if connection.vendor == "sqlite" and query == {"q": "approve"}:
            assert outcomes and all(outcomes), "walked, every page"
        if connection.vendor == "sqlite" and query == {"q": "payroll"}:
            assert outcomes and not any(outcomes), "looked up"


# Exports


def test_the_exports_hold_every_column_each_run_event_and_say_who_took_them(
    team: Team, reviewer: User, auditor: User
) -> None:
    from actions.models import AuditExport

    run = engine.start_run("send_invoice", {"invoice_id": "=HYPERLINK(1)", "amount": 7}, team, reviewer)
    (it,) = engine.pending_interrupts(run.pk)
    engine.resume(it, {"approved": True, "comment": "@SUM(A1)"}, reviewer)
    client = staff(auditor)

    body = b"".join(client.get("/history/export.csv").streaming_content).decode()  # type: ignore[attr-defined]
    header, row = list(csv.reader(io.StringIO(body)))
    assert header == [
        "interrupt_id", "run_id", "seq", "team", "action", "consumer", "status", "message", "data",
        "answer", "reason", "requested_by", "decided_by", "decided_via", "edited_arguments",
        "comments", "created_at", "decided_at", "seconds_to_decision",
    ]  # fmt: skip
    record = dict(zip(header, row, strict=True))
    assert json.loads(record["data"]) == {"invoice_id": "=HYPERLINK(1)", "amount": 7.0}
    assert json.loads(record["answer"]) == {"approved": True, "comment": "@SUM(A1)"}
    assert (record["requested_by"], record["decided_by"], record["decided_via"]) == ("reviewer1",) * 2 + (
        "dashboard",
    )
    assert record["comments"] == "0"
    assert float(record["seconds_to_decision"]) >= 0

    # A cell a spreadsheet would run is text: the JSON ones start with "{", plain ones quoted.
    hostile = engine.start_run("send_invoice", {"invoice_id": "X", "amount": 1}, team, reviewer)
    (second,) = engine.pending_interrupts(hostile.pk)
    engine.reject(second, "=cmd|' /C calc'!A0", reviewer)
    exported = client.get("/history/export.csv").streaming_content  # type: ignore[attr-defined]
    rows = list(csv.reader(io.StringIO(b"".join(exported).decode())))
    assert rows[1][header.index("reason")] == "'=cmd|' /C calc'!A0"

    lines = b"".join(client.get("/history/export.jsonl").streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    first = json.loads(lines[-1])
    assert first["answer"] == {"approved": True, "comment": "@SUM(A1)"}, "JSON Lines: values as they are"

    events = b"".join(client.get("/history/events.jsonl", {"run": run.pk}).streaming_content).decode()  # type: ignore[attr-defined]
    logged = [json.loads(line) for line in events.splitlines()]
    assert [event["kind"] for event in logged] == list(
        RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True)
    )
    assert all(len(event["hash"]) == 64 for event in logged)
    events_csv = b"".join(client.get("/history/events.csv", {"run": run.pk}).streaming_content).decode()  # type: ignore[attr-defined]
    assert next(csv.reader(io.StringIO(events_csv)))[:3] == ["event_id", "seq", "run_id"]
    assert client.get("/history/export.xlsx").status_code == 404

    taken = list(
        AuditExport.objects.order_by("at", "id").values_list("user_name", "what", "format", "filters")
    )
    assert taken[0] == ("auditor", "interrupts", "csv", {})
    assert ("auditor", "events", "jsonl", {"run": str(run.pk)}) in taken


def test_reviewer_and_deadline_figures(team: Team, auditor: User) -> None:
    cache.clear()
    bulk_history(team, 4)  # reviewer1 approves, 1..4 minutes
    bulk_history(team, 2, decided_by="reviewer2")
    Interrupt.objects.filter(decided_by_name="reviewer2").update(status="rejected")
    now = timezone.now()
    late = bulk_history(team, 3, decided_by="reviewer2")
    Interrupt.objects.filter(pk__in=[it.pk for it in late]).update(expires_at=now - timedelta(days=1))
    Interrupt.objects.filter(pk=late[0].pk).update(escalated_at=now)
    page = staff(auditor).get("/history/")
    people = {person.name: person for person in page.context["people"]}
    assert people["reviewer1"].decisions == 4 and people["reviewer1"].rejected == 0
    assert people["reviewer2"].decisions == 5 and people["reviewer2"].rejected == pytest.approx(0.4)
    (row,) = page.context["deadlines"]
    assert (row.with_deadline, row.breached, row.escalated) == (3, 3, 1)
    html = page.content.decode()
    assert 'id="reviewers"' in html and 'id="deadlines"' in html and "40%" in html


def test_a_members_event_log_export_keeps_an_errors_text_for_staff(
    team: Team, reviewer: User, auditor: User
) -> None:
    from actions.engine.journal import log

    run = engine.start_run("send_invoice", {"invoice_id": "ERR-1", "amount": 1}, team, reviewer)
    (it,) = engine.pending_interrupts(run.pk)
    engine.reject(it, "no", reviewer)
    log(run, RunEvent.Kind.ERROR, None, None, error="KeyError: 'secret-internal-path'")
    member = Client()
    member.force_login(reviewer)

    def error_detail(client: Client) -> Any:
        body = b"".join(client.get("/history/events.jsonl").streaming_content).decode()  # type: ignore[attr-defined]
        (error,) = [json.loads(line) for line in body.splitlines() if json.loads(line)["kind"] == "error"]
        return error["detail"]

    assert error_detail(member) == {}
    assert "secret-internal-path" in error_detail(staff(auditor))["error"]
