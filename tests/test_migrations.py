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
