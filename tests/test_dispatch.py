"""Fanning out: what a commit's dispatch looks at, what the periodic round does, and the
embedded server's notifier process (fed through a pipe, started again when it dies)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions import engine, notify
from actions.models import Fanout, Notification, Run, RunEvent, Team, Webhook
from actions.notify.process import Notifier
from tests.integration.processes import wait_for
from tests.test_webhooks import registered
from tests.webhook_receiver import Receiver

dispatch = importlib.import_module("actions.notify.dispatch")  # the module, not the function


def told_runs(receiver: Receiver, secret: str) -> list[int]:
    return [body["data"]["run_id"] for body in receiver.verified(secret)]


def a_run(team: Team, by: User | None, invoice: str) -> Run:
    return engine.start_run("send_invoice", {"invoice_id": invoice, "amount": 5.0}, team, by)


def settle(run: Run) -> None:
    """The run's events as if logged ten minutes ago (in SQL: the log is append-only for the
    application, not for a test that moves time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE actions_runevent SET at = %s WHERE run_id = %s",
            [timezone.now() - timedelta(minutes=10), run.pk],
        )


@pytest.mark.django_db
@pytest.mark.usefixtures("steps")
def test_a_commits_dispatch_tells_the_runs_it_names_and_the_round_tells_the_rest(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    secret = registered(client, token_key, receiver.url, ["interrupt.created"])["secret"]
    first, second = a_run(team, reviewer, "D-1"), a_run(team, reviewer, "D-2")
    assert notify.dispatch([first.pk]) == 1
    assert told_runs(receiver, secret) == [first.pk], "only the run the commit named"
    assert notify.dispatch([first.pk]) == 0, "told once"
    assert dispatch.MissedEvents()() == 1, "the periodic round finds what no dispatch told"
    assert sorted(told_runs(receiver, secret)) == sorted([first.pk, second.pk])


@pytest.mark.django_db(transaction=True)  # two threads, each with its own connection
@pytest.mark.usefixtures("steps")
def test_dispatches_of_the_same_run_at_once_work_out_its_event_once(
    client: Client,
    token_key: str,
    team: Team,
    reviewer: User,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notifications' worker runs a dispatch per commit that asked, in several threads: two
    of the same run take turns, and the second finds the event told, rather than working it out
    again only to lose the race for its Fanout row."""
    secret = registered(client, token_key, receiver.url, ["interrupt.created"])["secret"]
    run = a_run(team, reviewer, "D-1")
    worked_out: list[int] = []
    fan_out = dispatch.fan_out

    def slow_fan_out(event: RunEvent, subscribers: Any = None) -> list[Notification]:
        worked_out.append(event.pk)
        time.sleep(0.3)  # time for the other dispatch to reach the same event
        notifications: list[Notification] = fan_out(event, subscribers)
        return notifications

    monkeypatch.setattr(dispatch, "fan_out", slow_fan_out)
    made: list[int] = []

    def dispatch_in_a_thread() -> None:
        try:
            made.append(notify.dispatch([run.pk]))
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatch_in_a_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(made) == [0, 1], "one notification, made by one of them"
    assert len(worked_out) == 1, "the event was worked out by both"
    assert told_runs(receiver, secret) == [run.pk]


@pytest.mark.django_db
@pytest.mark.usefixtures("steps")
def test_a_dispatch_that_listed_events_another_told_here_meanwhile_asks_nothing_more(
    client: Client,
    token_key: str,
    team: Team,
    reviewer: User,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The processes that paused and decided a run each ask for a dispatch: two of the
    notifications' worker's threads list the same events. The one that waited its turn finds
    them told by the other without a query, and an event it has never seen still asks."""
    registered(client, token_key, receiver.url)
    run = a_run(team, reviewer, "D-1")
    listed = list(RunEvent.objects.filter(run=run, kind__in=list(dispatch.TYPES)))
    assert notify.dispatch([run.pk]) == 1
    with CaptureQueriesContext(connection) as queries:
        assert [dispatch._tell(event, dispatch.Subscribers()) for event in listed] == [None]
    assert queries.captured_queries == []
    # The same id logged anew (a database emptied under a running worker) is not taken for it,
    # nor is an event told a minute ago (a database restored since may have lost its Fanout row).
    again = RunEvent(pk=listed[0].pk, run_id=run.pk, kind=listed[0].kind, at=timezone.now())
    monkeypatch.setattr(dispatch._Recent, "SECONDS", 0.0)
    made = Notification.objects.count()
    for event in (again, listed[0]):
        with CaptureQueriesContext(connection) as queries:
            assert dispatch._tell(event, dispatch.Subscribers()) is None  # its Fanout row says so
        fanout = [q["sql"] for q in queries.captured_queries if '"actions_fanout"' in q["sql"]]
        # Not asked for first: the row's insert finds it there.
        assert len(fanout) == 1 and fanout[0].startswith("INSERT") and "ON CONFLICT" in fanout[0]
    assert Notification.objects.count() == made, "nothing made twice"


@pytest.mark.django_db(transaction=True)  # autocommit: the Fanout row's insert is a transaction
@pytest.mark.usefixtures("steps")
def test_an_event_with_no_one_to_tell_is_marked_told_once_in_autocommit(
    team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event that tells no one (no webhook, no mail for it) is marked told by its Fanout
    row alone; told again (by another dispatcher), the row's insert says so, and nothing fails."""
    run = a_run(team, reviewer, "D-1")
    (event,) = RunEvent.objects.filter(run=run, kind=RunEvent.Kind.INTERRUPTED)
    assert dispatch._tell(event, dispatch.Subscribers()) == []
    assert Fanout.objects.filter(event=event).exists()
    monkeypatch.setattr(dispatch, "_told", dispatch._Recent())  # another process's, which never told it
    assert dispatch._tell(event, dispatch.Subscribers()) is None
    assert Fanout.objects.filter(event=event).count() == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("steps")
def test_a_dispatch_reads_the_teams_webhooks_and_routing_once_for_all_its_events(
    client: Client, token_key: str, team: Team, reviewer: User, receiver: Receiver
) -> None:
    """A run's pause, decision and end, fanned out together: each is told, and the team's
    webhooks and routing are read once, not once per event; each event's interrupt or run is
    read with its run and team in one statement."""
    secret = registered(client, token_key, receiver.url)["secret"]
    run = a_run(team, reviewer, "D-1")
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True}, reviewer)
    with CaptureQueriesContext(connection) as queries:
        assert notify.dispatch([run.pk]) == 3
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert sum('FROM "actions_webhook"' in sql for sql in reads) == 1
    assert sum('FROM "actions_teamchannels"' in sql for sql in reads) == 1
    assert sum('JOIN "actions_team" t' in sql for sql in reads) == 3
    assert not any(
        sql.startswith(('SELECT * FROM "actions_team"', 'SELECT * FROM "actions_run"')) for sql in reads
    )
    bodies = receiver.verified(secret)
    assert [body["type"] for body in bodies] == ["interrupt.created", "interrupt.decided", "run.finished"]


def test_the_commits_of_the_gathering_time_are_fanned_out_as_one_task(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A run's pause, decision and end follow each other within milliseconds: what a process's
    commits ask for within GRUNDLAG_DISPATCH_GATHER_SECONDS goes to the `notify` queue as one
    task, not one each."""
    from actions import background
    from actions.notify import delivery

    settings.GRUNDLAG_DISPATCH_GATHER_SECONDS = 1.0  # wide: the calls below take milliseconds
    sent: list[list[int] | None] = []
    monkeypatch.setattr(dispatch, "_send", sent.append)
    monkeypatch.setattr(background, "runs_where_sent", lambda: False)  # as a worker or daphne runs it
    monkeypatch.setattr(dispatch, "_wanted_runs", set())  # not what eager tests left asked for
    dispatch.dispatch_soon(runs=[7])
    dispatch.dispatch_soon(run_id=5)
    time.sleep(0.05)
    dispatch.dispatch_soon(runs=[6])
    delivery._background.submit(lambda: None).result(timeout=10)  # the dispatch thread is done
    assert sent == [[5, 6, 7]]


@pytest.mark.django_db
@pytest.mark.usefixtures("steps")
def test_the_periodic_round_starts_after_the_events_it_has_settled(
    client: Client,
    token_key: str,
    team: Team,
    reviewer: User,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = registered(client, token_key, receiver.url, ["interrupt.created"])
    secret = hook["secret"]
    # Registered before the events it is to hear of.
    Webhook.objects.filter(pk=hook["id"]).update(created_at=timezone.now() - timedelta(minutes=20))
    missed = dispatch.MissedEvents()
    old, older = a_run(team, reviewer, "S-1"), a_run(team, reviewer, "S-2")
    settle(old)
    settle(older)
    monkeypatch.setattr(dispatch, "BATCH", 1)  # a backlog: one event per round
    assert missed() == 1
    untold = RunEvent.objects.filter(fanout__isnull=True, kind="interrupted").get()
    assert missed.after_id < untold.pk, "not past an event it has not told"
    assert missed() == 1
    last = RunEvent.objects.order_by("-at", "-id").filter(at__lt=timezone.now() - missed.SETTLED).first()
    assert last is not None and missed.after_id == last.pk, "past everything settled once all is told"
    assert sorted(told_runs(receiver, secret)) == sorted([old.pk, older.pk])

    # Behind the round for good: an event it had told, made untold again, is not looked at
    # again by the round (a whole-log dispatch still would).
    Fanout.objects.filter(event=untold).delete()
    assert missed() == 0
    fresh = a_run(team, reviewer, "S-3")
    assert missed() == 1, "what is newer than the settled events is looked at"
    assert told_runs(receiver, secret)[-1] == fresh.pk


# The embedded server's notifier process: its parent's end, with a stand-in child that writes
# down the lines it reads (the real one is tested through `manage.py serve`:
# tests/integration/test_notify.py).

ECHO = """
import signal, sys
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as the notifier, once started
with open(sys.argv[1], "a", buffering=1) as out:
    out.write(f"started {__import__('os').getpid()}\\n")
    for line in sys.stdin:
        out.write(line)
"""


def lines_in(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_the_notifier_gets_each_line_and_is_started_again_when_it_dies(tmp_path: Path) -> None:
    written = tmp_path / "lines"
    notifier = Notifier([sys.executable, "-c", ECHO, str(written)])
    notifier.start()
    try:
        notifier.wake([7, 3])
        notifier.wake(None)
        notifier.deliver(12)
        wait_for(lambda: len(lines_in(written)) >= 4, timeout=10, what="the lines")
        first_pid = notifier.pid
        assert lines_in(written) == [f"started {first_pid}", "runs 3 7", "all", "deliver 12"]

        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        wait_for(lambda: notifier._proc is not None and notifier._proc.poll() is not None, timeout=10)
        notifier.ping()  # what the server's periodic round sends: the dead one is replaced
        notifier.deliver(13)
        wait_for(lambda: "deliver 13" in lines_in(written), timeout=10, what="the line after the restart")
        assert notifier.pid != first_pid
        # The line that found it dead is not sent again: the new one's first round looks at
        # everything (dispatch_missed, deliver_due), that line's work with it.
        assert lines_in(written)[-2:] == [f"started {notifier.pid}", "deliver 13"]
    finally:
        notifier.stop(timeout=5)
    assert notifier._proc is not None and notifier._proc.returncode == 0, "it ends when its pipe closes"


def test_a_notifier_still_starting_up_is_not_waited_for(tmp_path: Path) -> None:
    """A server stopped while its notifier is still starting (Django's setup takes seconds on a
    busy machine) does not wait for it to finish starting only to stop: it has nothing under
    way, and what it would have sent is in the database for the next one."""
    written = tmp_path / "lines"
    starting = f"import time; time.sleep(30)\n{ECHO}"
    notifier = Notifier([sys.executable, "-c", starting, str(written)])
    notifier.start()
    notifier.wake([7])
    started = time.monotonic()
    notifier.stop(timeout=20)
    assert time.monotonic() - started < 10  # not the 30 s it would take to start
    assert notifier._proc is not None and notifier._proc.returncode == -signal.SIGTERM
    assert lines_in(written) == []


@pytest.mark.django_db
@pytest.mark.usefixtures("steps")
def test_an_event_read_against_a_schema_this_code_does_not_match_is_left_for_a_later_round(
    team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-upgrade, a process whose models name a column the database lacks (or the reverse)
    cannot read an event's interrupt: the round stops, and the event is not marked told, so a
    process that matches the database tells it. (A bug in one event's own data is skipped.)"""
    from django.db import ProgrammingError

    run = a_run(team, reviewer, "D-9")

    def mismatched(*args: Any, **kwargs: Any) -> Any:
        raise ProgrammingError('column i."added_later" does not exist')

    monkeypatch.setattr(engine, "read_interrupt", mismatched)
    with pytest.raises(ProgrammingError):
        notify.dispatch([run.pk])
    assert not Fanout.objects.filter(event__run=run).exists()
    monkeypatch.undo()
    assert notify.dispatch([run.pk]) >= 0
    assert Fanout.objects.filter(event__run=run).exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("steps", "database")
def test_an_events_notifications_are_inserted_as_rows_not_as_arrays(team: Team, reviewer: User) -> None:
    """An event's notifications are one INSERT of rows (VALUES): as arrays (Django's UNNEST on
    PostgreSQL) their JSON payloads were quoted into array literals, twice the CPU."""
    second = User.objects.create_user("reviewer2", password="pw-reviewer2", email="r2@example.com")
    team.members.add(second, through_defaults={"role": "approver"})
    User.objects.filter(pk=reviewer.pk).update(email="r1@example.com")
    run = a_run(team, None, "D-R")
    with CaptureQueriesContext(connection) as queries:
        notify.dispatch([run.pk])
    inserts = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith('INSERT INTO "actions_notification"')
    ]
    assert len(inserts) == 1 and "UNNEST" not in inserts[0]
    made = Notification.objects.filter(event__run=run).order_by("recipient_id")
    assert [n.recipient_id for n in made] == sorted([reviewer.pk, second.pk])
    assert all(
        n.payload["type"] == "interrupt.created" and n.payload["data"]["run_id"] == run.pk for n in made
    )
