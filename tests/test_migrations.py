"""Upgrades: data written by the previous release keeps working after migrate."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from actions.engine.driving import call_binding

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("actions", "0006_team_created_index")]
AFTER = [("actions", "0009_backfill_binding")]


def test_pauses_from_before_call_binding_resume_as_they_would_have() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    team = old.get_model("actions", "Team").objects.create(name="Finance", slug="finance")
    Run: Any = old.get_model("actions", "Run")
    OldInterrupt: Any = old.get_model("actions", "Interrupt")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "send_invoice", "arguments": '{"amount": 1}'},
    }
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}, call]},
    ]
    agent = Run.objects.create(
        action="agent", team=team, consumer="agent", driver_state={"messages": messages}
    )
    script = Run.objects.create(
        action="script",
        team=team,
        consumer="sandbox",
        driver_state={"paused": {"position": 2, "action": "send_invoice", "input": {"amount": 3}}},
    )
    plain = Run.objects.create(action="send_invoice", team=team)
    for run, tool_call_id in ((agent, "c1"), (script, ""), (plain, "")):
        OldInterrupt.objects.create(
            run=run, seq=1, team=team, action="send_invoice", message="?", tool_call_id=tool_call_id
        )

    executor.loader.build_graph()
    executor.migrate(AFTER)
    Interrupt: Any = executor.loader.project_state(AFTER).apps.get_model("actions", "Interrupt")
    try:
        # As that release's models read it (today's have columns added since).
        bindings = dict(Interrupt.objects.values_list("run_id", "binding"))
        assert bindings[agent.pk] == call_binding("send_invoice", {"amount": 1}, turn=1, position=1)
        assert bindings[script.pk] == call_binding("send_invoice", {"amount": 3}, position=2)
        assert bindings[plain.pk] == call_binding("send_invoice")
        assert json.dumps(bindings)  # stored as JSON
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_the_members_from_before_roles_become_approvers() -> None:
    executor = MigrationExecutor(connection)
    before, after = [("actions", "0021_journal_function")], [("actions", "0022_membership_roles")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    team = old.get_model("actions", "Team").objects.create(name="Finance", slug="finance")
    person = old.get_model("auth", "User").objects.create(username="old-member")
    team.members.add(person)
    (row_id,) = old.get_model("actions", "Team").members.through.objects.values_list("pk", flat=True)
    try:
        executor.loader.build_graph()
        executor.migrate(after)
        Membership: Any = executor.loader.project_state(after).apps.get_model("actions", "Membership")
        (kept,) = Membership.objects.all()
        assert (kept.pk, kept.user_id, kept.team_id, kept.role) == (row_id, person.pk, team.pk, "approver")
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_search_documents_are_written_again_without_true_false_and_null() -> None:
    """0027: SQLite's documents leave out what PostgreSQL's always did, and the index on a run's
    events alone goes (runevent_run_seq serves it) with the audit chain's trigger kept."""
    executor = MigrationExecutor(connection)
    before, after = [("actions", "0026_gateway_receipts")], [("actions", "0027_lighter_writes")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    team = old.get_model("actions", "Team").objects.create(name="Finance", slug="finance")
    run = old.get_model("actions", "Run").objects.create(
        action="send_invoice", team=team, input={"invoice_id": "INV-9"}
    )
    interrupt = old.get_model("actions", "Interrupt").objects.create(
        run=run, seq=1, team=team, action="send_invoice", message="Approve?", data={"amount": 12},
        answer={"approved": True, "rush": False, "note": None, "by": "Ada"}, status="approved",
    )  # fmt: skip

    def words() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT document FROM actions_interrupt_search WHERE rowid = %s", [interrupt.pk])
            return sorted(cursor.fetchone()[0].split())

    def schema(kind: str) -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name FROM sqlite_master WHERE type = %s AND tbl_name = 'actions_runevent'", [kind]
            )
            return {name for (name,) in cursor.fetchall()}

    assert words() == ["0", "1", "12", "Ada", "Approve?", "INV-9"]
    assert "actions_runevent_run_id_2fa08eb6" in schema("index")
    try:
        executor.loader.build_graph()
        executor.migrate(after)
        assert words() == ["12", "Ada", "Approve?", "INV-9"]
        assert "actions_runevent_run_id_2fa08eb6" not in schema("index")
        assert {"runevent_run_seq"} <= schema("index") and schema("trigger") == {"actions_auditchain_move"}
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN SELECT id FROM actions_runevent WHERE run_id = %s", [run.pk])
            assert "runevent_run_seq" in " ".join(str(row[-1]) for row in cursor.fetchall())
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.usefixtures("database")
def test_0027_goes_back_and_forth_on_both_databases(team: Any, reviewer: Any) -> None:
    """Back at 0026 the search trigger fires on a change of status alone and the run's index is
    there; at 0027 neither. Then forth again, as an upgrade does."""
    from actions import engine
    from actions.models import Interrupt
    from tests.search import plant, planted

    executor = MigrationExecutor(connection)

    def status_changed_alone() -> bool:
        run = engine.start_run("send_invoice", {"invoice_id": "INV-1", "amount": 1}, team, reviewer)
        (interrupt,) = engine.pending_interrupts(run.pk)
        plant(interrupt.pk)
        Interrupt.objects.filter(pk=interrupt.pk).update(status="cancelled")
        return interrupt.pk not in planted()

    def indexed_by_run() -> bool:
        with connection.cursor() as cursor:
            return "actions_runevent_run_id_2fa08eb6" in connection.introspection.get_constraints(
                cursor, "actions_runevent"
            )

    assert not status_changed_alone() and not indexed_by_run()
    try:
        executor.migrate([("actions", "0026_gateway_receipts")])
        assert status_changed_alone() and indexed_by_run()
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert not status_changed_alone() and not indexed_by_run()
