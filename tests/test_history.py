"""The audit history: staff only, filters, keyset pages, CSV export, decision times, retention."""

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
from django.test import Client
from django.utils import timezone

from actions import engine
from actions.models import Interrupt, Run, RunEvent, Team

pytestmark = pytest.mark.django_db(transaction=True)


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


def test_history_is_for_staff_only(team: Team, reviewer: User) -> None:
    client = Client()
    client.force_login(reviewer)
    assert client.get("/history/").status_code == 302
    assert client.get("/history/export.csv").status_code == 302


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
    today = timezone.now().date().isoformat()
    assert len(client.get("/history/", {"since": today, "until": today}).context["rows"]) >= 1


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
    assert response.streaming and response["Content-Type"] == "text/csv"
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
