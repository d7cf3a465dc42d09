"""The engine's SQL helpers keep the ORM's meaning: what they write the ORM reads back the same,
and what they read is what a queryset would give. Every test runs on SQLite and on PostgreSQL
(the database fixture, tests/conftest.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine import sql as engine_sql
from actions.engine.sql import Json, insert
from actions.models import Interrupt, Run, RunEvent, Team

# Runs on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("database")]


@pytest.fixture
def run(team: Team) -> Run:
    return Run.objects.create(action="send_invoice", input={"invoice_id": "INV-1"}, team=team)


def test_what_insert_writes_the_orm_reads_back_unchanged(run: Run) -> None:
    created = timezone.now() - timedelta(days=3)
    interrupt = Interrupt(
        run=run,
        seq=1,
        team=run.team,
        action="send_invoice",
        message="Approve «this»?",
        data={"amount": 10.5, "lines": [{"sku": "a", "qty": 2}], "note": None},
        state=["checkpoint", 1],
        created_at=created,
        assignees=["reviewer1"],
    )
    insert(interrupt)

    assert interrupt.pk is not None and not interrupt._state.adding
    read = Interrupt.objects.get(pk=interrupt.pk)
    assert read.data == {"amount": 10.5, "lines": [{"sku": "a", "qty": 2}], "note": None}
    assert read.state == ["checkpoint", 1]
    assert read.message == "Approve «this»?"
    assert read.created_at == created
    assert read.assignees == ["reviewer1"]
    # None in a JSON field is SQL NULL, as the ORM saves it, so isnull lookups still find it.
    assert Interrupt.objects.filter(pk=interrupt.pk, answer__isnull=True).exists()


def test_a_computed_column_is_the_databases_value_and_comes_back_on_the_instance(run: Run) -> None:
    next_seq = "(SELECT COALESCE(MAX(seq), 0) + %s FROM actions_interrupt WHERE run_id = %s)"
    first, second = (
        insert(
            Interrupt(run=run, team=run.team, action="send_invoice", message=message),
            ("seq", next_seq, [1, run.pk]),
        )
        for message in ("first", "second")
    )
    assert (first.seq, second.seq) == (1, 2)
    assert list(run.interrupts.order_by("seq").values_list("message", "seq")) == [("first", 1), ("second", 2)]


def test_fetch_gives_each_column_to_its_field_whatever_order_the_sql_names_them(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(attempt=3, driver_state={"messages": [1]})

    (fetched,) = engine_sql.fetch(
        Run, "SELECT driver_state, attempt, id, input, created_at FROM actions_run WHERE id = %s", [run.pk]
    )

    assert fetched.pk == run.pk
    assert fetched.attempt == 3
    assert fetched.driver_state == {"messages": [1]}
    assert fetched.input == {"invoice_id": "INV-1"}
    assert fetched.created_at == Run.objects.get(pk=run.pk).created_at
    # Columns it did not select are deferred: read from the database when first used.
    assert "action" in fetched.get_deferred_fields()
    assert fetched.action == "send_invoice"


def test_an_update_returning_rows_gives_instances_and_an_update_matching_none_gives_none(run: Run) -> None:
    sql = "UPDATE actions_run SET status = %s WHERE id = %s AND status = %s RETURNING id, status"

    assert [r.status for r in engine_sql.fetch(Run, sql, ["running", run.pk, "queued"])] == ["running"]
    assert engine_sql.fetch(Run, sql, ["running", run.pk, "queued"]) == []


def test_a_fetched_instance_is_an_ordinary_model_instance(run: Run) -> None:
    (fetched,) = engine_sql.fetch(Run, "SELECT id, status, team_id FROM actions_run WHERE id = %s", [run.pk])

    assert fetched == run and not fetched._state.adding and fetched._state.db == "default"
    assert fetched.team == run.team  # a foreign key loads through its descriptor
    fetched.status = "running"
    fetched.save(update_fields=["status"])
    run.refresh_from_db()
    assert run.status == "running"


def test_a_template_names_tables_and_columns_from_the_models() -> None:
    from django.db import connection

    quote = connection.ops.quote_name
    statement = engine_sql.sql("UPDATE {Run} SET {Run.status} = %s WHERE {Run.team} = %s")
    assert (
        statement == f"UPDATE {quote('actions_run')} SET {quote('status')} = %s WHERE {quote('team_id')} = %s"
    )
    with pytest.raises(Exception, match="nonesuch"):
        engine_sql.sql("SELECT {Run.nonesuch} FROM {Run}")


def test_parameters_are_stored_as_the_fields_store_them(run: Run) -> None:
    lease = timezone.now() + timedelta(minutes=5)
    changed = engine_sql.execute(
        "UPDATE actions_run SET lease_expires_at = %s, output = %s, driver_state = %s WHERE id = %s",
        [lease, Json(None), Json({"k": ["v", 1]}), run.pk],
    )

    assert changed == 1
    read = Run.objects.get(pk=run.pk)
    assert (read.lease_expires_at, read.driver_state) == (lease, {"k": ["v", 1]})
    assert Run.objects.filter(pk=run.pk, output__isnull=True, lease_expires_at__gt=timezone.now()).exists()


def test_fetch_leaves_out_a_column_its_model_does_not_have(run: Run) -> None:
    # A process not yet upgraded reads with SELECT * a table that a newer release's migration
    # gave a column (docs/how-to/upgrade.md: migrate first, then the processes): it goes on.
    (read,) = engine_sql.fetch(Run, "SELECT *, 'x' AS added_later FROM actions_run WHERE id = %s", [run.pk])
    assert (read.pk, read.action, read.input) == (run.pk, run.action, run.input)
    assert not hasattr(read, "added_later")


def test_an_event_inserted_by_the_engine_is_still_append_only(run: Run) -> None:
    event = insert(RunEvent(run=run, kind=RunEvent.Kind.STARTED, actor_name="system", detail={"a": 1}))

    assert RunEvent.objects.get(pk=event.pk).detail == {"a": 1}
    with pytest.raises(TypeError, match="append-only"):
        event.save()


def test_each_database_variant_runs_on_its_own_database_in_every_thread(database: str) -> None:
    """The PostgreSQL variant is not SQLite under another name: the engine's connection, and a
    connection a thread of the test opens, are both to the variant's database."""
    import threading

    from django.conf import settings
    from django.db import connection

    vendors: list[str] = []

    def in_a_thread() -> None:
        try:
            vendors.append(connection.vendor)
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        finally:
            connection.close()

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(10)
    # The "sqlite" variant runs on the configured database: SQLite unless DATABASE_URL says else.
    configured = "postgresql" if "postgresql" in settings.DATABASES["default"]["ENGINE"] else "sqlite"
    expected = "postgresql" if database == "postgresql" else configured
    assert (connection.vendor, engine_sql.default_db().vendor, vendors) == (expected, expected, [expected])


def test_a_reading_is_kept_per_database_and_keeps_no_connection_alive(run: Run) -> None:
    # Under ASGI each request has a connection of its own: how a row is read (its fields'
    # converters) is looked up once per database, made from whichever connection came first,
    # and serves every other one without keeping the first alive.
    import gc
    import weakref

    from django.db import connections

    from actions.engine.sql import _reading, default_db

    columns = ("id", "created_at", "input", "status")
    engine_sql._readings.clear()
    first = connections.create_connection(default_db().alias)
    kept = _reading(first, Run, columns)
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None, "the reading keeps no connection"
    assert _reading(connections.create_connection(default_db().alias), Run, columns) is kept

    (fetched,) = engine_sql.fetch(
        Run, "SELECT id, created_at, input, status FROM actions_run WHERE id = %s", [run.pk]
    )
    assert fetched.created_at == Run.objects.get(pk=run.pk).created_at
    assert fetched.created_at.tzinfo is not None and fetched.input == {"invoice_id": "INV-1"}


def test_people_are_a_teams_active_members_each_once_with_their_preferences(
    team: Team, other_team: Team, django_assert_num_queries: Any
) -> None:
    # Whom an interrupt's event is told to (actions.notify): read as the engine reads, with what
    # each chose, as select_related would give it.
    from django.contrib.auth.models import User

    from actions.engine.store import people
    from actions.models import Membership, Preferences, Role

    ann, bob, cy, gone = (User.objects.create_user(name) for name in ("ann", "bob", "cy", "gone"))
    gone.is_active = False
    gone.save()
    team.members.add(ann, bob, gone)
    other_team.members.add(bob, cy)
    Preferences.objects.create(user=bob, email=False, slack_user_id="U0BOB")
    # In the roles asked for only, as the membership in that team says.
    dee, eve = User.objects.create_user("dee"), User.objects.create_user("eve")
    Membership.objects.create(team=team, user=dee, role=Role.VIEWER)
    Membership.objects.create(team=team, user=eve, role=Role.AUDITOR)
    Membership.objects.create(team=other_team, user=eve, role=Role.ADMIN)

    with django_assert_num_queries(2):
        found = people([team.pk, other_team.pk], Role.DECIDE)
        ann_read, bob_read = found[:2]
        assert bob_read.grundlag_preferences.slack_user_id == "U0BOB"
        assert bob_read.grundlag_preferences.user is bob_read
        with pytest.raises(Preferences.DoesNotExist):
            ann_read.grundlag_preferences  # noqa: B018 - chose none: as select_related says
    assert [user.username for user in found] == ["ann", "bob", "cy", "eve"]
    assert [user.username for user in people([team.pk], Role.DECIDE)] == ["ann", "bob"]
    assert [user.username for user in people([team.pk], Role.WORK)] == ["ann", "bob", "dee"]
    assert [user.username for user in people([team.pk], Role.READ)] == ["ann", "bob", "dee", "eve"]
    assert [user.username for user in people([team.pk], {Role.AUDITOR})] == ["eve"]
    assert [user.username for user in people([team.pk], Role.DECIDE, usernames=["bob", "cy"])] == ["bob"]
    assert [user.username for user in people([other_team.pk], Role.DECIDE, user_id=bob.pk)] == ["bob"]
    assert people([team.pk], Role.DECIDE, user_id=cy.pk) == [] and people([], Role.DECIDE) == []
    assert people([team.pk], Role.DECIDE, user_id=dee.pk) == [] and people([team.pk], ()) == []
    # An assignee that is not a string (an action's own list) names no one, as the ORM's did;
    # naming no one is no one, not everyone.
    assert people([team.pk], Role.DECIDE, usernames=[42]) == []  # type: ignore[list-item]
    assert people([team.pk], Role.DECIDE, usernames=[]) == []


def test_the_events_to_tell_are_the_recent_untold_ones_of_those_kinds_oldest_first(team: Team) -> None:
    # What the notifications' dispatcher reads on every commit's path (actions.notify), as the
    # engine reads: by kind, since a moment, not told yet (no Fanout row), of some runs, after an
    # event, at most so many.
    from datetime import timedelta

    from actions.engine.journal import log
    from actions.engine.store import events_to_tell
    from actions.models import Fanout

    first, second = (Run.objects.create(action="send_invoice", input={}, team=team) for _ in range(2))
    for run in (first, second, first):
        log(run, RunEvent.Kind.INTERRUPTED, None, note=run.pk)
    log(first, RunEvent.Kind.CLAIMED, None)
    told, *untold = RunEvent.objects.filter(kind=RunEvent.Kind.INTERRUPTED).order_by("id")
    Fanout.objects.create(event=told)
    since = timezone.now() - timedelta(minutes=1)

    found = events_to_tell([RunEvent.Kind.INTERRUPTED], since, None, 0, 10)
    assert [event.pk for event in found] == [event.pk for event in untold]
    assert found[0].detail == {"note": second.pk} and found[0].at == untold[0].at
    assert "actor_name" not in found[0].get_deferred_fields(), "a comment's event says who wrote it"
    assert [e.pk for e in events_to_tell([RunEvent.Kind.INTERRUPTED], since, {first.pk}, 0, 10)] == [
        untold[1].pk
    ]
    assert [e.pk for e in events_to_tell([RunEvent.Kind.INTERRUPTED], since, None, untold[0].pk, 10)] == [
        untold[1].pk
    ]
    assert len(events_to_tell([RunEvent.Kind.INTERRUPTED, RunEvent.Kind.CLAIMED], since, None, 0, 2)) == 2
    later = timezone.now() + timedelta(minutes=1)
    assert events_to_tell([RunEvent.Kind.INTERRUPTED], later, None, 0, 10) == []
    assert events_to_tell([RunEvent.Kind.INTERRUPTED], since, set(), 0, 10) == []


def test_a_teams_webhooks_in_force_and_its_channels_are_read_as_the_engine_reads(
    team: Team, other_team: Team
) -> None:
    from actions.engine.store import team_channels, webhooks_of
    from actions.models import TeamChannels, Webhook

    first, off, second, theirs = (
        Webhook.objects.create(team=owner, url=f"https://example.com/{n}")
        for n, owner in enumerate((team, team, team, other_team))
    )
    Webhook.objects.filter(pk=off.pk).update(disabled_at=timezone.now())
    assert [hook.pk for hook in webhooks_of([team.pk])] == [first.pk, second.pk]
    assert [hook.pk for hook in webhooks_of([team.pk, other_team.pk])] == [first.pk, second.pk, theirs.pk]
    assert webhooks_of([team.pk])[0].secret == first.secret and webhooks_of([]) == []
    assert team_channels(team.pk) is None
    TeamChannels.objects.create(team=team, slack_channel="C0123")
    channels = team_channels(team.pk)
    assert channels is not None and channels.slack_channel == "C0123" and channels.email_events


def test_a_runs_events_have_one_index_by_run() -> None:
    """runevent_run_seq (run, seq) serves every lookup by run; an event is not also written into
    an index of the run alone (0027)."""
    from django.db import connection

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, RunEvent._meta.db_table)
    by_run = {name for name, c in constraints.items() if c["index"] and c["columns"][:1] == ["run_id"]}
    assert by_run == {"runevent_run_seq"}
    assert constraints["runevent_run_seq"]["columns"] == ["run_id", "seq"]


@pytest.mark.usefixtures("steps")
def test_on_postgresql_the_engines_repeated_statements_are_prepared(database: str, team: Team) -> None:
    """Values go to PostgreSQL as parameters and a statement a connection repeats is prepared
    (settings.POSTGRESQL_STATEMENT_OPTIONS): it is then executed without being parsed and planned
    again. The engine's own statements too, such as the read of a run's pending interrupts."""
    from django.db import connection

    from actions import engine

    if connection.vendor != "postgresql":
        assert database == "sqlite"
        return
    assert connection.connection.prepare_threshold == 5
    for n in range(6):
        run = engine.start_run("transfer_funds", {"amount": 250 + n, "to": "DE12"}, team, None)
        assert len(engine.pending_interrupts(run.pk)) == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [statement for (statement,) in cursor.fetchall()]
    # One statement for every run, whatever its id: the value is a parameter, not in the text.
    pending = 'SELECT * FROM "actions_interrupt" WHERE "run_id" = $1 AND "status" = $2 ORDER BY "seq"'
    assert pending in prepared
    # A column a migration adds while the connection holds the statement prepared (the processes
    # of the release before still running as the new one migrates): it still reads.
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the test's transaction's checks, done
        cursor.execute("ALTER TABLE actions_interrupt ADD COLUMN added_later integer")
    assert len(engine.pending_interrupts(run.pk)) == 1


def test_a_statement_of_more_values_than_postgresql_binds_still_runs(run: Run) -> None:
    """The protocol carries at most 65,535 parameters a statement: more (a long ``__in`` list,
    a large ``bulk_create``) go in the statement's text, with a literal % kept as it is."""
    if engine_sql.default_db().vendor != "postgresql":
        return  # SQLite binds as many as its build allows (SQLITE_MAX_VARIABLE_NUMBER)
    ids = [run.pk, *range(10**9, 10**9 + 70_000)]
    assert not Run.objects.filter(pk__in=ids, error__contains="%").exists()
    Run.objects.filter(pk=run.pk).update(error="failed at 5% done")
    assert list(Run.objects.filter(pk__in=ids, error__contains="5% done").values_list("pk", flat=True)) == [
        run.pk
    ]
    made = Run.objects.bulk_create(Run(action="bulk", input={"n": n}, team=run.team) for n in range(5_000))
    assert len(made) == 5_000 and Run.objects.filter(action="bulk").count() == 5_000


def test_on_postgresql_a_transactions_begin_travels_with_its_first_statement(database: str) -> None:
    """psycopg sent BEGIN and waited for its answer before a transaction's first statement: a
    round trip of its own for each transaction. The two now go together, in one pipeline, and
    the transaction is the same: its rows are read, a failed first statement fails it, a
    rollback undoes it."""
    import tempfile

    from django.db import DataError, connection
    from psycopg.pq import Trace, TransactionStatus

    from grundlag_site.db.postgresql.base import DatabaseWrapper

    if connection.vendor != "postgresql":
        assert database == "sqlite"
        return
    # A connection of its own: the test's is inside the test's transaction already.
    other = DatabaseWrapper(dict(connection.settings_dict), alias="begin-with-first")
    ended: list[TransactionStatus] = []  # each transaction's state before its commit or rollback
    try:
        with other.cursor() as cursor:
            cursor.execute("CREATE TEMPORARY TABLE counted (n integer PRIMARY KEY)")

        def transaction(*statements: tuple[str, list[Any]], commit: bool = True) -> tuple[list[str], Any]:
            """Run ``statements`` as transaction.atomic() runs them (autocommit off, then a
            commit or a rollback): the messages the client sent, as libpq traces them, and
            the rows of the last statement."""
            with tempfile.TemporaryFile("w+") as trace:
                pgconn = other.connection.pgconn
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
                try:
                    other.set_autocommit(False)
                    with other.cursor() as cursor:
                        for sql, params in statements:
                            cursor.execute(sql, params)
                        rows = cursor.fetchall() if cursor.description else None
                finally:
                    ended.append(pgconn.transaction_status)
                    other.commit() if commit and ended[-1] == TransactionStatus.INTRANS else other.rollback()
                    other.set_autocommit(True)
                    pgconn.untrace()
                trace.seek(0)
                # "F <length> <message> <its fields>": what the client (frontend) sent
                sent = [line.split()[2:] for line in trace.read().splitlines() if line.startswith("F\t")]
                return [" ".join(message) for message in sent], rows

        def round_trips(sent: list[str]) -> int:
            # The client waits for the server's answer after a Sync (extended protocol) and
            # after a Query (simple protocol).
            return sum(message.split()[0] in ("Sync", "Query") for message in sent)

        insert_one = ("INSERT INTO counted (n) VALUES (%s)", [1])
        sent, _ = transaction(insert_one, commit=False)
        assert sent[0].startswith('Parse "" "BEGIN"'), sent  # in the pipeline, not a Query of its own
        assert [message.split()[0] for message in sent].index("Sync") > 4  # the INSERT before it
        assert round_trips(sent) == 2, sent  # BEGIN with the INSERT, then ROLLBACK
        sent, _ = transaction(("INSERT INTO counted (n) VALUES (%s)", [2]), ("SELECT 1 FROM counted", []))
        assert round_trips(sent) == 3, sent  # the second statement goes as before
        sent, rows = transaction(("SELECT n, %s FROM counted", ["read"]))
        assert rows == [(2, "read")] and round_trips(sent) == 2, sent  # a first statement's rows
        with pytest.raises(DataError):  # a first statement that fails fails its transaction
            transaction(("SELECT 1 / %s", [0]), insert_one)
        assert ended == [TransactionStatus.INTRANS] * 3 + [TransactionStatus.INERROR]
        with other.cursor() as cursor:
            cursor.execute("SELECT n FROM counted")
            assert cursor.fetchall() == [(2,)]  # rolled back twice, committed once
    finally:
        other.close()


def test_on_postgresql_a_transactions_last_statement_can_travel_with_its_commit(
    database: str, caplog: Any
) -> None:
    """The statement a transaction ends with, held (hold_for_commit), goes with the COMMIT in
    one round trip; its rows reach the caller once committed, before the on_commit callbacks.
    If it fails, nothing of the transaction is committed and nothing announced; nothing runs
    between it and the commit; and nothing is held where no COMMIT follows."""
    import tempfile

    from django.db import DataError, connection, connections, transaction
    from psycopg.pq import Trace, TransactionStatus

    from grundlag_site.db.postgresql.base import DatabaseWrapper, HeldStatementError

    if connection.vendor != "postgresql":
        assert database == "sqlite"
        return
    alias = "last-with-commit"  # a connection of its own, outside the test's transaction
    other = DatabaseWrapper({**connection.settings_dict, "TEST": {}}, alias=alias)
    connections[alias] = other
    happened: list[Any] = []
    try:
        with other.cursor() as cursor:
            cursor.execute("CREATE TEMPORARY TABLE counted (n integer PRIMARY KEY)")

        def insert(n: int) -> None:
            with other.cursor() as cursor:
                cursor.execute("INSERT INTO counted (n) VALUES (%s)", [n])

        def ended_with(query: str, params: list[Any], *, before: int = 1) -> list[str]:
            """A transaction that inserts ``before`` and ends with ``query`` held: what the
            client sent, as libpq traces it."""
            with tempfile.TemporaryFile("w+") as trace:
                pgconn = other.connection.pgconn
                pgconn.trace(trace.fileno())
                pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
                try:
                    with transaction.atomic(using=alias):
                        insert(before)
                        transaction.on_commit(lambda: happened.append("on_commit"), using=alias)
                        held = other.hold_for_commit(query, params, lambda rows: happened.append(rows))
                        assert held
                finally:
                    pgconn.untrace()
                trace.seek(0)
                lines = trace.read().splitlines()
                return [" ".join(line.split()[2:]) for line in lines if line.startswith("F\t")]

        sent = ended_with("INSERT INTO counted (n) VALUES (%s) RETURNING n", [2])
        # What went before each wait for the server's answers (a Sync; psycopg's Flush waits
        # for nothing): the BEGIN with the INSERT, then the held statement with the COMMIT.
        waits = " ".join("Sync" if message.startswith("Sync") else message for message in sent)
        parsed = [[m.split('"')[3] for m in part.split("Parse ")[1:]] for part in waits.split("Sync")]
        assert "Query" not in waits and parsed[:2] == [
            ["BEGIN", "INSERT INTO counted (n) VALUES ($1)"],
            ["INSERT INTO counted (n) VALUES ($1) RETURNING n", "COMMIT"],
        ], sent
        assert len(parsed) == 3 and parsed[2] == [], sent  # nothing after the second Sync
        assert happened == [[(2,)], "on_commit"]  # its rows first, then the callbacks

        happened.clear()
        with pytest.raises(DataError):  # it fails: the transaction's insert is not committed
            ended_with("SELECT 1 / %s", [0], before=3)
        assert happened == [] and other.connection.pgconn.transaction_status == TransactionStatus.IDLE

        # A statement after it is refused, not reordered, however it is run.
        with pytest.raises(HeldStatementError), transaction.atomic(using=alias):
            insert(4)
            assert other.hold_for_commit("INSERT INTO counted (n) VALUES (%s)", [5], happened.append)
            insert(6)
        with pytest.raises(HeldStatementError), transaction.atomic(using=alias):
            insert(4)
            assert other.hold_for_commit("INSERT INTO counted (n) VALUES (%s)", [5], happened.append)
            with other.cursor() as cursor:
                cursor.executemany("INSERT INTO counted (n) VALUES (%s)", [[6], [7]])
        assert happened == []

        # Committed, it stays committed, and its callbacks run, if what is given its rows fails.
        def fails(rows: list[Any]) -> None:
            raise RuntimeError("numbering failed")

        with transaction.atomic(using=alias):
            insert(3)
            transaction.on_commit(lambda: happened.append("on_commit"), using=alias)
            assert other.hold_for_commit("INSERT INTO counted (n) VALUES (%s)", [4], fails)
        assert happened == ["on_commit"] and "numbering failed" in caplog.text  # told, not raised

        # Where no COMMIT follows at once, nothing is held: the caller runs it.
        assert not other.hold_for_commit("SELECT %s", [1], happened.append)  # autocommit
        with transaction.atomic(using=alias):
            insert(7)
            with transaction.atomic(using=alias):  # a savepoint
                assert not other.hold_for_commit("SELECT %s", [1], happened.append)
            with transaction.atomic(using=alias, savepoint=False):  # its end commits nothing
                assert not other.hold_for_commit("SELECT %s", [1], happened.append)
        with other.cursor() as cursor:
            cursor.execute("SELECT n FROM counted ORDER BY n")
            assert cursor.fetchall() == [(1,), (2,), (3,), (4,), (7,)]
    finally:
        other.close()
        del connections[alias]


def approved_cycle(team: Team, amount: int) -> Run:
    """A run that pauses once and is approved (as bench.engine_throughput runs it)."""
    from actions import engine

    run = engine.start_run("transfer_funds", {"amount": amount, "to": "DE12"}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    engine.resume(interrupt, {"approved": True}, None)
    return run


@pytest.mark.django_db(transaction=True)  # the engine's transactions commit
def test_on_postgresql_an_engine_cycle_makes_fourteen_round_trips(
    database: str, team: Team, settings: Any
) -> None:
    """A committed cycle, steps inline: each transaction's BEGIN goes with its first statement
    and its journal with its COMMIT. The inbox changes announced carry the numbers the
    journal gave them, and the audit chain verifies."""
    import tempfile

    from django.db import connection
    from psycopg.pq import Trace

    from actions.engine import audit, journal
    from actions.models import InboxStream

    if connection.vendor != "postgresql":
        assert database == "sqlite"
        return

    settings.GRUNDLAG_INLINE_STEPS = True
    approved_cycle(team, 10)  # the process's caches filled
    announced: list[int] = []

    def heard(sender: Any, changes: list[journal.InboxChange], **kwargs: Any) -> None:
        announced.extend(change.seq[team.pk] for change in changes)

    journal.team_changed.connect(heard)
    try:
        with tempfile.TemporaryFile("w+") as trace:
            pgconn = connection.connection.pgconn
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
            try:
                run = approved_cycle(team, 20)
            finally:
                pgconn.untrace()
            trace.seek(0)
            sent = [line.split()[2] for line in trace.read().splitlines() if line.startswith("F\t")]
    finally:
        journal.team_changed.disconnect(heard)
    run.refresh_from_db()
    assert run.status == "completed"
    # 14 statements in 4 transactions: each statement its round trip, but a transaction's
    # BEGIN and its COMMIT go with its first statement and its last (18 before the COMMIT's).
    assert sum(message in ("Sync", "Query") for message in sent) == 14, sent
    last = InboxStream.objects.get(team=team).seq
    assert announced == [last - 1, last]  # the pause, the decision: as the journal numbered them
    assert audit.verify().ok


@pytest.mark.django_db(transaction=True)  # the engine's transactions commit
def test_on_postgresql_a_decision_whose_journal_fails_with_its_commit_changes_and_announces_nothing(
    database: str, team: Team, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal goes with the COMMIT: when it fails there, the decision is rolled back as a
    whole (the interrupt still pending, the run still waiting), no one is told of it, and the
    same decision made again goes through."""
    from django.db import DataError, connection
    from psycopg.pq import TransactionStatus

    from actions import engine
    from actions.engine import audit, journal

    if connection.vendor != "postgresql":
        assert database == "sqlite"
        return
    settings.GRUNDLAG_INLINE_STEPS = True
    run = engine.start_run("transfer_funds", {"amount": 5, "to": "DE12"}, team, None)
    (interrupt,) = engine.pending_interrupts(run.pk)
    announced: list[str] = []

    def heard(sender: Any, changes: list[journal.InboxChange], **kwargs: Any) -> None:
        announced.extend(change.event for change in changes)

    journal.team_changed.connect(heard)
    try:
        # A detail PostgreSQL's jsonb refuses (a NUL), in the decision's event: its journal fails.
        record = audit.decision_record
        monkeypatch.setattr(audit, "decision_record", lambda *args: "refused\x00")
        with pytest.raises(DataError) as failed:
            engine.resume(interrupt, {"approved": True}, None)
        assert any(entry.name == "_commit" for entry in failed.traceback)  # raised by the commit
        assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE  # rolled back
        assert announced == []
        assert [it.pk for it in engine.pending_interrupts(run.pk)] == [interrupt.pk]
        run.refresh_from_db()
        assert run.status == Run.Status.INTERRUPTED
        assert not RunEvent.objects.filter(run=run, kind="approved").exists()

        monkeypatch.setattr(audit, "decision_record", record)
        (interrupt,) = engine.pending_interrupts(run.pk)
        engine.resume(interrupt, {"approved": True}, None)
    finally:
        journal.team_changed.disconnect(heard)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED and announced == ["decided"]
    assert audit.verify().ok


def test_an_engine_cycle_runs_the_statements_it_needs_and_no_more(
    database: str, team: Team, settings: Any
) -> None:
    """A run that pauses once and is approved, its steps inline (as bench.engine_throughput
    runs it): its statements, counted, so that one more on the engine's path is a decision
    (bench/RESULTS.md has what each costs), not an accident. Each transaction adds a BEGIN and
    a COMMIT, on PostgreSQL in the round trips of its first statement and its last."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.GRUNDLAG_INLINE_STEPS = True
    approved_cycle(team, 10)  # the process's caches (a team's slug for the metrics, ...) filled
    with CaptureQueriesContext(connection) as queries:
        run = approved_cycle(team, 20)
    run.refresh_from_db()
    assert run.status == "completed"
    # The test's own transaction makes each of the engine's a savepoint: not counted.
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    expected = {"sqlite": 19, "postgresql": 14}[database]
    assert len(statements) == expected, "\n".join(statements)
