"""The engine: runs, pauses, decisions and recovery, against the real (SQLite) database."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions import engine
from actions.engine import rules, store
from actions.engine import steps as engine_steps
from actions.engine.driving import StepResult
from actions.models import ApiToken, AuditChain, Interrupt, Run, RunEvent, Team
from grundlag_site.celery import run_tasks_where_sent

# Every test runs with steps in workers and inline, on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]


@pytest.fixture
def no_worker() -> Iterator[None]:
    """Celery as deployed: a step sent to a worker now would wait in the broker for one."""
    run_tasks_where_sent(False)
    yield
    run_tasks_where_sent()


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch, database: str) -> list[int]:
    """Counts the transactions the database commits (each one appends to the list)."""
    counted: list[int] = []
    # The variant's connection itself, not the proxy: it is restored whatever ends first.
    wrapper = connections[DEFAULT_DB_ALIAS]
    commit: Callable[[], None] = wrapper.commit

    def counting() -> None:
        counted.append(1)
        commit()

    monkeypatch.setattr(wrapper, "commit", counting)
    return counted


def start(team: Team, by: User, action: str = "send_invoice", **payload: Any) -> Run:
    payload = payload or {"invoice_id": "INV-1", "amount": 10.0}
    run = engine.start_run(action, payload, team, by)
    run.refresh_from_db()
    return run


def pending(run: Run) -> Interrupt:
    return run.interrupts.get(status=Interrupt.Status.PENDING)


def kinds(run: Run) -> list[str]:
    return list(run.events.values_list("kind", flat=True))


def test_a_run_pauses_once_and_completes_with_the_answer(team: Team, reviewer: User) -> None:
    run = start(team, reviewer)
    assert run.status == Run.Status.INTERRUPTED
    interrupt = pending(run)
    assert (interrupt.seq, interrupt.message) == (1, "Approve sending the invoice?")
    assert interrupt.data == {"invoice_id": "INV-1", "amount": 10.0}

    engine.resume(interrupt, {"approved": True, "comment": "ok"}, reviewer)

    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert run.output == {
        "sent": True,
        "invoice_id": "INV-1",
        "approved_by_answer": {"approved": True, "comment": "ok"},
    }
    interrupt.refresh_from_db()
    assert interrupt.status == "approved" and interrupt.decided_by == reviewer
    assert kinds(run) == ["started", "claimed", "interrupted", "approved", "resumed", "claimed", "completed"]


def test_two_pauses_carry_the_checkpoint_from_the_first_to_the_second(
    requester: User, team: Team, reviewer: User, second_reviewer: User
) -> None:
    run = start(team, requester, "transfer_funds", amount=5000.0, to="DE12")
    engine.resume(pending(run), {"approved": True, "by": "first"}, reviewer)
    second = pending(run)
    assert second.seq == 2
    assert second.state == {"first_answer": {"approved": True, "by": "first"}}
    engine.resume(second, {"approved": True, "by": "second"}, second_reviewer)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    assert run.output == {
        "transferred": True,
        "answers": [{"approved": True, "by": "first"}, {"approved": True, "by": "second"}],
    }
    assert [it.status for it in run.interrupts.order_by("seq")] == ["approved", "approved"]


def test_small_transfer_needs_one_approval_and_a_declining_answer_fails_the_run(
    requester: User, team: Team, reviewer: User
) -> None:
    small = start(team, requester, "transfer_funds", amount=10.0, to="DE12")
    engine.resume(pending(small), {"approved": True}, reviewer)
    small.refresh_from_db()
    assert small.output == {"transferred": True, "answers": [{"approved": True}]}

    declined = start(team, requester, "transfer_funds", amount=10.0, to="DE12")
    engine.resume(pending(declined), {"approved": False}, reviewer)
    declined.refresh_from_db()
    assert (declined.status, declined.error) == ("failed", "transfer declined")


def test_reject_ends_the_run_rejected_with_the_reason(team: Team, reviewer: User) -> None:
    run = start(team, reviewer)
    engine.reject(pending(run), "wrong customer", reviewer)
    run.refresh_from_db()
    assert (run.status, run.error) == ("rejected", "wrong customer")
    assert run.finished_at is not None
    interrupt = run.interrupts.get()
    assert (interrupt.status, interrupt.reason, interrupt.decided_by_name) == (
        "rejected",
        "wrong customer",
        "reviewer1",
    )


def test_a_run_that_ends_by_a_decision_or_a_cancel_announces_its_status(team: Team, reviewer: User) -> None:
    """The requests waiting on a run wake only for the status they wait for (a decided approval:
    a finished run), and the engine's signal names it: a rejection and a cancel announce how the
    run ended, as a step's end does, not only the inbox's change."""
    from actions.engine import journal

    told: list[tuple[int, str, bool]] = []

    def heard(sender: Any, *, run_id: int, status: str, finished: bool, **kwargs: Any) -> None:
        told.append((run_id, status, finished))

    journal.run_changed.connect(heard, dispatch_uid="test-heard")
    try:
        rejected, cancelled = start(team, reviewer), start(team, reviewer)
        told.clear()
        engine.reject(pending(rejected), "wrong customer", reviewer)
        engine.cancel(cancelled, reviewer)
    finally:
        journal.run_changed.disconnect(dispatch_uid="test-heard")
    assert told == [(rejected.pk, "rejected", True), (cancelled.pk, "cancelled", True)]


def test_reject_without_a_reason_is_refused_and_changes_nothing(team: Team, reviewer: User) -> None:
    run = start(team, reviewer)
    with pytest.raises(engine.InvalidInput):
        engine.reject(pending(run), "   ", reviewer)
    assert pending(run).status == "pending"


def test_an_answer_that_does_not_fit_the_answer_model_changes_nothing(
    requester: User, team: Team, reviewer: User
) -> None:
    run = start(team, requester, "delete_customer_data", customer_id="cus_1")
    interrupt = pending(run)
    with pytest.raises(engine.InvalidAnswer) as caught:
        engine.resume(interrupt, {"confirm_customer_id": "cus_1", "scope": "all of it"}, reviewer)
    locs = {tuple(error["loc"]) for error in caught.value.errors}
    assert locs == {("scope",), ("ticket",)}
    interrupt.refresh_from_db()
    run.refresh_from_db()
    assert interrupt.status == "pending" and run.status == "interrupted"
    assert "approved" not in kinds(run)


def test_a_typed_answer_that_does_not_match_pauses_again(requester: User, team: Team, reviewer: User) -> None:
    run = start(team, requester, "delete_customer_data", customer_id="cus_1")
    engine.resume(pending(run), {"confirm_customer_id": "cus_2", "ticket": "T-9"}, reviewer)
    again = pending(run)
    assert again.seq == 2 and isinstance(again.data, dict)
    assert again.data["previous_confirmation"] == "cus_2"
    engine.resume(again, {"confirm_customer_id": "cus_1", "ticket": "T-9", "scope": "everything"}, reviewer)
    run.refresh_from_db()
    assert run.output == {"deleted": "cus_1", "scope": "everything", "ticket": "T-9"}


def test_a_second_decision_is_refused_naming_who_decided_and_when(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    run = start(team, reviewer)
    interrupt = pending(run)
    engine.resume(interrupt, {"approved": True}, reviewer)
    with pytest.raises(engine.AlreadyDecided, match=r"already approved by reviewer1 at \d{4}-\d\d-\d\d"):
        engine.reject(interrupt, "too late", second_reviewer)
    with pytest.raises(engine.AlreadyDecided):
        engine.resume(interrupt, {"approved": True}, second_reviewer)
    assert kinds(run).count("resumed") == 1


@pytest.mark.django_db(transaction=True)  # two threads, two connections: each must see the other's commits
def test_two_reviewers_deciding_at_once_give_exactly_one_decision_and_one_resume(
    team: Team, reviewer: User, second_reviewer: User
) -> None:
    run = start(team, reviewer)
    interrupt = pending(run)
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def decide(user: User) -> None:
        try:
            barrier.wait()
            engine.resume(interrupt, {"approved": True, "who": user.username}, user)
            outcomes[user.username] = "won"
        except engine.AlreadyDecided as exc:
            outcomes[user.username] = str(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(user,)) for user in (reviewer, second_reviewer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(outcomes.values())[-1] == "won"
    loser = next(value for value in outcomes.values() if value != "won")
    winner = next(name for name, value in outcomes.items() if value == "won")
    assert loser.startswith(f"already approved by {winner}")
    run.refresh_from_db()
    assert run.status == "completed"
    assert isinstance(run.output, dict) and run.output["approved_by_answer"]["who"] == winner
    assert kinds(run).count("resumed") == 1 and kinds(run).count("completed") == 1


def test_invalid_input_is_refused_before_a_run_exists(team: Team, reviewer: User) -> None:
    with pytest.raises(engine.InvalidInput) as caught:
        engine.start_run("send_invoice", {"invoice_id": "", "amount": -1}, team, reviewer)
    assert {tuple(e["loc"]) for e in caught.value.errors} == {("invoice_id",), ("amount",)}
    assert not Run.objects.exists()


def test_oversized_input_is_refused_naming_the_limit(team: Team, reviewer: User, settings: Any) -> None:
    settings.GRUNDLAG_MAX_PAYLOAD_BYTES = 1024
    with pytest.raises(engine.PayloadTooLarge, match="the limit is 1024 bytes"):
        engine.start_run("send_invoice", {"invoice_id": "x" * 2000, "amount": 1}, team, reviewer)
    assert not Run.objects.exists()


def test_a_claim_is_taken_once_so_a_duplicate_delivery_runs_nothing(team: Team, reviewer: User) -> None:
    run = start(team, reviewer)
    engine.execute_step(run.pk)  # a redelivered message for the step that already ran
    run.refresh_from_db()
    assert run.interrupts.count() == 1 and kinds(run).count("claimed") == 1


@pytest.mark.parametrize("steps", ["worker"], indirect=True)
@pytest.mark.parametrize("asker", ["person", "token"])
def test_a_workers_step_reads_its_run_once_in_the_claim_even_to_record_who_asked(
    team: Team, reviewer: User, no_worker: None, asker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording a pause reads who asked (the team's rules and grants go by it): it comes with
    the claim, not by a query of its own for each of its fields."""
    from actions.models import TeamRule
    from actions.tasks import run_step

    # A rule that reads who asked, and does not hold: the interrupt waits for people.
    TeamRule.objects.create(team=team, name="robots", when='requester == "robot"', then="reject", reason="no")

    monkeypatch.setattr(run_step, "apply_async", lambda *args, **kwargs: None)  # queued, not sent
    by: Any = reviewer if asker == "person" else ApiToken.issue(team, "deploys")[0]
    run = engine.start_run("send_invoice", {"invoice_id": "INV-8", "amount": 3.0}, team, by)
    assert Run.objects.get(pk=run.pk).status == "queued"
    rules.team_set(team.pk)  # read once per process, and again when they change
    runs = connection.ops.quote_name(Run._meta.db_table)
    with CaptureQueriesContext(connection) as queries:
        engine.execute_step(run.pk)
    statements = [query["sql"] for query in queries]
    # On PostgreSQL the claim first takes its team's fair-share lock (store.claim_queued): a
    # statement that locks, and reads nothing of the run for the step.
    locks = [sql for sql in statements if "pg_advisory_xact_lock" in sql]
    assert len(locks) == (connection.vendor == "postgresql")
    reads = [
        sql for sql in statements if sql.startswith("SELECT") and f"FROM {runs}" in sql and sql not in locks
    ]
    assert reads == [], "\n".join(reads)
    assert sum(sql.startswith(f"UPDATE {runs}") for sql in statements) == 2  # the claim, the record
    assert pending(run).status == Interrupt.Status.PENDING


@pytest.mark.django_db(transaction=True)  # it counts the commits
@pytest.mark.parametrize("steps", ["inline"], indirect=True)
def test_inline_steps_run_in_the_callers_process_and_claim_as_they_queue(
    team: Team, reviewer: User, no_worker: None, commits: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from actions import metrics

    monkeypatch.setattr(metrics, "_slugs", {})  # a team of an earlier test may have had this id
    # As after the migration (a test's flush empties it); making it commits once.
    _, made_chain = AuditChain.objects.get_or_create(pk=1)
    # A process reads a team's rules and grants once, and again only when they change: the
    # pause reads their version with the team's policy, in the statement it always made.
    rules.team_set(team.pk)
    store.journal_in_one_call()  # asked once per process (on PostgreSQL: is its function there?)
    with CaptureQueriesContext(connection) as queries:
        run = engine.start_run("send_invoice", {"invoice_id": "INV-7", "amount": 3.0}, team, reviewer)
        (interrupt,) = engine.pending_interrupts(run.pk)
        assert (interrupt.seq, interrupt.data) == (1, {"invoice_id": "INV-7", "amount": 3.0})
        engine.resume(interrupt, {"approved": True}, reviewer)

    run.refresh_from_db()
    assert run.status == "completed" and run.attempt == 2
    assert engine.pending_interrupts(run.pk) == []
    assert kinds(run) == ["started", "claimed", "interrupted", "approved", "resumed", "claimed", "completed"]
    # Start and claim, the pause, the decision and claim, the end: the claims cost no
    # transaction of their own (steps in workers take six), and each transaction writes its
    # events in one statement.
    assert len(commits) == 4 + made_chain
    statements = [query["sql"] for query in queries if not query["sql"].startswith(("BEGIN", "COMMIT"))]
    # Two check the reviewer's role (may they start a run, may they decide); the pause and the
    # decision each number their change in the team's inbox stream; the metrics learn the
    # team's name (once per team and process); PostgreSQL also locks the run for the decision.
    # The requests waiting on the run in other processes hear of its changes from PostgreSQL
    # itself (a trigger NOTIFYs them):
    # no statement of the engine's. Each transaction chains its events (the audit): one
    # statement reads the chain's head (locked) and its run's last hash (the insert moves the
    # head on). On PostgreSQL the journal of each transaction (its chained events and its
    # teams' stream numbers) is one call of a server function instead (migration 0021): 6 fewer
    # round trips a cycle. No page is connected, so no frame is rendered.
    if connection.vendor == "postgresql":
        expected = 18 + 4 + 1 - 6
        journal_calls = [sql for sql in statements if "grundlag_append_journal(" in sql]
        assert len(journal_calls) == 4, "one call a transaction"
    else:
        expected = 18 + 4
    assert len(statements) == expected, "\n".join(statements)
    assert not any("pg_notify" in sql for sql in statements)
    events = connection.ops.quote_name(RunEvent._meta.db_table)
    inserts = sum(sql.startswith(f"INSERT INTO {events}") for sql in statements)
    assert inserts == (0 if connection.vendor == "postgresql" else 4)


@pytest.mark.parametrize("steps", ["inline"], indirect=True)
def test_an_inline_step_that_dies_before_recording_is_handed_on_when_its_lease_runs_out(
    team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    record = engine.record

    def disk_fails(run: Run, result: StepResult) -> None:
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(engine_steps, "record", disk_fails)
    run = engine.start_run("send_invoice", {"invoice_id": "INV-8", "amount": 3.0}, team, reviewer)
    run.refresh_from_db()
    # The caller's start is committed; the step holds its lease, as a worker that died would.
    assert run.status == "running" and run.lease_expires_at is not None
    assert "the sweeper will retry it" in caplog.text

    monkeypatch.setattr(engine_steps, "record", record)
    assert engine.sweep() == 0  # the lease has not run out
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert engine.sweep() == 1
    run.refresh_from_db()
    assert run.status == "interrupted" and run.attempt == 2
    assert kinds(run) == ["started", "claimed", "requeued", "claimed", "interrupted"]


def test_pending_interrupts_are_the_undecided_ones_in_order(
    requester: User, team: Team, reviewer: User
) -> None:
    run = start(team, requester, "transfer_funds", amount=5000.0, to="DE12")
    (first,) = engine.pending_interrupts(run.pk)
    engine.resume(first, {"approved": True}, reviewer)
    (second,) = engine.pending_interrupts(run.pk)
    assert (first.seq, second.seq) == (1, 2) and second.status == "pending"
    engine.reject(second, "no", reviewer)
    assert engine.pending_interrupts(run.pk) == []


def test_the_sweeper_requeues_a_step_whose_worker_died(team: Team, reviewer: User) -> None:
    run = Run.objects.create(action="send_invoice", input={"invoice_id": "A", "amount": 1}, team=team)
    # A worker claimed it and died: running, with a lease that has run out.
    Run.objects.filter(pk=run.pk).update(
        status="running", attempt=1, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert engine.sweep() == 1
    run.refresh_from_db()
    assert run.status == "interrupted" and run.attempt == 2
    assert engine.sweep() == 0


def test_a_worker_that_lost_its_lease_cannot_overwrite_the_new_attempt(team: Team, reviewer: User) -> None:
    run = Run.objects.create(action="send_invoice", input={"invoice_id": "A", "amount": 1}, team=team)
    Run.objects.filter(pk=run.pk).update(status="running", attempt=1)
    stale = Run.objects.get(pk=run.pk)
    Run.objects.filter(pk=run.pk).update(attempt=2)  # the sweeper re-queued it; another worker claimed it
    engine.record(stale, StepResult(Run.Status.FAILED, error="late"))
    run.refresh_from_db()
    assert run.status == "running" and run.error == ""


def test_cancel_ends_the_run_and_its_pending_interrupt(team: Team, reviewer: User) -> None:
    run = start(team, reviewer)
    engine.cancel(run, reviewer)
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert run.interrupts.get().status == "cancelled"
    with pytest.raises(engine.AlreadyDecided, match="already cancelled by reviewer1"):
        engine.resume(run.interrupts.get(), {"approved": True}, reviewer)
    with pytest.raises(engine.NotCancellable):
        engine.cancel(run, reviewer)


def test_the_event_log_is_append_only(team: Team, reviewer: User) -> None:
    run = start(team, reviewer)
    event = run.events.first()
    assert event is not None
    event.actor_name = "someone else"
    with pytest.raises(TypeError):
        event.save()
    with pytest.raises(TypeError):
        event.delete()
    with pytest.raises(TypeError):
        RunEvent.objects.filter(run=run).update(actor_name="x")
    with pytest.raises(TypeError):
        RunEvent.objects.filter(run=run).delete()


def test_a_step_that_never_records_fails_its_run_after_the_requeue_limit(
    team: Team, reviewer: User, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A step whose result can never be written (or that kills its worker) is not re-run at
    every lease's end forever."""
    settings.GRUNDLAG_MAX_STEP_REQUEUES = 3

    def disk_fails(run: Run, result: StepResult) -> None:
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(engine_steps, "record", disk_fails)
    run = engine.start_run("send_invoice", {"invoice_id": "INV-9", "amount": 3.0}, team, reviewer)
    for _ in range(3):
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        engine.sweep()
        run.refresh_from_db()
        assert run.status == "running", "re-queued, claimed and lost again"
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    engine.sweep()
    run.refresh_from_db()
    assert run.status == "failed" and "re-queued 3 times" in run.error
    assert kinds(run).count("requeued") == 3 and kinds(run)[-1] == "failed"


def test_an_interrupt_read_with_its_run_and_team_in_one_statement_is_what_the_orm_reads(
    team: Team, other_team: Team, reviewer: User
) -> None:
    """store.read_interrupt and read_run_of_team split one joined row into three (two) rows: each
    field of each is the ORM's, and ids that differ between the tables are not mixed up."""
    # The run's, the interrupt's and the team's ids apart. Sequences are not rolled back with a
    # test's transaction, so where they stand depends on the tests run before on this database:
    # a run another is started until its ids differ.
    for n in range(10):
        engine.start_run("send_invoice", {"invoice_id": f"O-{n}", "amount": 1}, other_team, None)
        Run.objects.create(action="send_invoice", input={}, team=other_team)
        run = engine.start_run("send_invoice", {"invoice_id": f"J-{n}", "amount": 7}, team, reviewer)
        (pending,) = engine.pending_interrupts(run.pk)
        if len({pending.pk, run.pk, team.pk}) == 3:
            break
    assert len({pending.pk, run.pk, team.pk}) == 3

    with CaptureQueriesContext(connection) as queries:
        it = store.read_interrupt(pending.pk)
        read_run = store.read_run_of_team(run.pk)
    assert len(queries.captured_queries) == 2
    assert it is not None and read_run is not None
    orm = Interrupt.objects.select_related("run", "team").get(pk=pending.pk)
    for got, expected in (
        (it, orm),
        (it.run, orm.run),
        (it.team, orm.team),
        (read_run, orm.run),
        (read_run.team, orm.team),
    ):
        for field in type(expected)._meta.concrete_fields:
            assert getattr(got, field.attname) == getattr(expected, field.attname), (type(got), field.name)
    assert store.read_interrupt(10**9) is None and store.read_run_of_team(10**9) is None
