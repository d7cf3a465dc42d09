"""API tokens with scopes and an expiry: every API operation and the MCP endpoint ask for a
scope, a token without it is refused with 403 naming it and nothing happens; an expired token is
refused as a revoked one is. Made and revoked by a team's admins on the Team page and by
manage.py create_api_token; those made before scopes keep every one."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any, cast

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from actions import engine, mcp
from actions.api import api as ninja_api
from actions.api.base import TokenAuth
from actions.models import ApiToken, Interrupt, Membership, Role, Run, Scope, Team
from tests.test_api import Api

pytestmark = [pytest.mark.django_db]


def token(team: Team, *scopes: Scope, **kwargs: Any) -> str:
    return ApiToken.issue(team, "scoped", [str(scope) for scope in scopes], **kwargs)[1]


def test_every_api_operation_asks_for_a_scope() -> None:
    operations = [
        (path, operation)
        for router in ninja_api._routers  # noqa: SLF001 - what the API serves, as ninja holds it
        for path, view in router[1].path_operations.items()
        for operation in view.operations
    ]
    assert len(operations) >= 19
    for path, operation in operations:
        (auth,) = operation.auth_callbacks
        assert isinstance(auth, TokenAuth) and auth.scopes, path
        assert set(auth.scopes) <= set(Scope.values), path
    # And the OpenAPI document says so, for each operation, as clients read it.
    documented = ninja_api.get_openapi_schema(path_prefix="/api/")["paths"]
    said = [operation for operations in documented.values() for operation in operations.values()]
    assert len(said) == len(operations)
    for operation in said:
        assert operation["security"] and all(len(each["TokenAuth"]) == 1 for each in operation["security"])
        assert "Token scope:" in operation["description"]
        assert "403" in operation["responses"] or 403 in operation["responses"]


@pytest.mark.usefixtures("database")
def test_a_token_without_the_scope_is_refused_naming_it_and_nothing_happens(
    client: Client, team: Team
) -> None:
    reader = Api(client, token(team, Scope.INTERRUPTS_READ))
    refused = reader.post("/runs", {"action": "send_invoice", "input": {"invoice_id": "INV-1", "amount": 5}})
    assert refused.status_code == 403
    assert refused.json()["missing_scope"] == ["runs:write"]
    assert "it needs the scope runs:write" in refused.json()["detail"]
    assert not Run.objects.exists()

    starter = Api(client, token(team, Scope.RUNS_WRITE))
    run = starter.post(
        "/runs", {"action": "send_invoice", "input": {"invoice_id": "INV-1", "amount": 5}}
    ).json()
    assert run["status"] == "interrupted"
    assert starter.get(f"/runs/{run['id']}").status_code == 200  # who starts a run reads it
    assert starter.get("/interrupts").json()["missing_scope"] == ["interrupts:read"]
    assert (
        reader.get("/interrupts").status_code == 200 and reader.get(f"/runs/{run['id']}").status_code == 200
    )
    resume = f"/interrupts/{run['interrupt']['id']}/resume"
    for lacking in (starter, reader):
        answer = lacking.post(resume, {"data": {"approved": True}})
        assert answer.status_code == 403 and answer.json()["missing_scope"] == ["interrupts:decide"]
    assert Interrupt.objects.get().status == Interrupt.Status.PENDING
    assert reader.get("/history").json()["missing_scope"] == ["history:read"]
    assert reader.get("/webhooks").json()["missing_scope"] == ["webhooks:write"]
    assert reader.post("/approvals", {"message": "Ship it?"}).json()["missing_scope"] == ["approvals:write"]

    decider = Api(client, token(team, Scope.INTERRUPTS_DECIDE))
    assert decider.post(resume, {"data": {"approved": True}}).json()["status"] == "completed"


@pytest.mark.usefixtures("database")
def test_a_decide_scope_does_not_loosen_the_decision_contract(client: Client, team: Team) -> None:
    # Assigned to people: a token decides nothing of it, whatever its scopes.
    Membership.objects.create(team=team, user=User.objects.create_user("cfo"), role=Role.APPROVER)
    from actions.drivers.approval import request_approval

    asked = request_approval(team, None, message="Pay it?", assignees=["cfo"])
    (interrupt,) = Interrupt.objects.filter(run=asked)
    decider = Api(client, token(team, *Scope))
    answer = decider.post(f"/interrupts/{interrupt.pk}/resume", {"data": {"approved": True}})
    assert answer.status_code == 403 and "Only cfo may decide this" in answer.json()["detail"]
    assert Interrupt.objects.get(pk=interrupt.pk).status == Interrupt.Status.PENDING


@pytest.mark.usefixtures("database")
def test_cancelling_another_callers_run_is_a_decision_and_needs_the_decide_scope(
    client: Client, team: Team
) -> None:
    invoice = {"action": "send_invoice", "input": {"invoice_id": "INV-2", "amount": 5}}
    starter = Api(client, token(team, Scope.RUNS_WRITE))
    other = Api(client, token(team, Scope.RUNS_WRITE))
    theirs = starter.post("/runs", invoice).json()
    refused = other.post(f"/runs/{theirs['id']}/cancel", {})
    assert refused.status_code == 403 and "needs the scope interrupts:decide" in refused.json()["detail"]
    assert starter.post(f"/runs/{theirs['id']}/cancel", {}).json()["status"] == "cancelled"  # withdrawn
    second = starter.post("/runs", invoice).json()
    decider = Api(client, token(team, Scope.RUNS_WRITE, Scope.INTERRUPTS_DECIDE))
    assert decider.post(f"/runs/{second['id']}/cancel", {}).json()["status"] == "cancelled"


@pytest.mark.usefixtures("database")
def test_an_expired_token_is_refused_as_a_revoked_one_is(client: Client, team: Team) -> None:
    lasting = Api(client, token(team, Scope.RUNS_WRITE, expires_at=timezone.now() + timedelta(hours=1)))
    assert lasting.get("/actions").status_code == 200
    expired = Api(client, token(team, Scope.RUNS_WRITE, expires_at=timezone.now() - timedelta(seconds=1)))
    response = expired.get("/actions")
    assert response.status_code == 401 and "expired" in response.json()["detail"]
    assert engine.authenticate(expired.key) is None


def mcp_calls(*keys: str) -> list[httpx.Response]:
    """A tools/call of the tests' `noted` action with each key, to an MCP endpoint of this
    test's own (its session manager lives on this test's loop)."""
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "noted", "arguments": {"text": "hi"}},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2025-11-25",
    }

    async def calls() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=cast(Any, mcp.Endpoint(mcp.build_server())))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return [
                await client.post("/mcp/", json=call, headers={**headers, "Authorization": f"Bearer {key}"})
                for key in keys
            ]

    return asyncio.run(calls())


# On SQLite only: the MCP endpoint reads the token on a thread of its executor's, which keeps the
# connection it had (the token's SQL is the API's, tested on both databases above).
@pytest.mark.django_db(transaction=True)  # served on other threads, with their own connections
def test_mcp_asks_for_the_mcp_scope(team: Team, ran: list[str]) -> None:
    without = token(team, Scope.RUNS_WRITE, Scope.INTERRUPTS_DECIDE)
    expired = token(team, Scope.MCP, expires_at=timezone.now() - timedelta(minutes=1))
    allowed = token(team, Scope.MCP)
    refused, gone, served = mcp_calls(without, expired, allowed)
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"
    assert refused.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="mcp"'
    assert gone.status_code == 401
    assert served.status_code == 200 and ran == ["hi"]


def test_create_api_token_takes_scopes_and_a_lifetime(team: Team, capsys: Any) -> None:
    call_command(
        "create_api_token",
        "finance",
        "--name",
        "ci",
        "--scope",
        "runs:write,interrupts:read",
        "--expires-in",
        "90d",
    )
    out = capsys.readouterr()
    made = ApiToken.objects.get(name="ci")
    assert made.scopes == ["runs:write", "interrupts:read"]
    assert made.expires_at is not None
    assert abs((made.expires_at - timezone.now()) - timedelta(days=90)) < timedelta(minutes=1)
    assert "scopes runs:write interrupts:read" in out.err and engine.authenticate(out.out.strip()) == made
    call_command("create_api_token", "finance", "--name", "all")
    assert ApiToken.objects.get(name="all").scopes == Scope.of_a_team() and capsys.readouterr()
    with pytest.raises(CommandError, match="not a scope: runs:delete"):
        call_command("create_api_token", "finance", "--scope", "runs:delete")
    with pytest.raises(CommandError, match="'soon' is not a lifetime"):
        call_command("create_api_token", "finance", "--expires-in", "soon")
    with pytest.raises(CommandError, match="not a lifetime"):
        call_command("create_api_token", "finance", "--expires-in", "9999d")
    assert ApiToken.objects.count() == 2


@pytest.mark.usefixtures("database")
def test_team_admins_make_and_revoke_tokens_on_the_team_page(team: Team) -> None:
    admin = User.objects.create_user("ada")
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    client = Client()
    client.force_login(admin)
    made = client.post(
        "/teams/finance/tokens/",
        {"name": "deploy bot", "scopes": ["runs:write", "history:read"], "expires_in_days": "30"},
    )
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    key = re.search(r'<code id="new-token-key">([^<]+)</code>', made.content.decode())
    assert key, "the key is shown once"
    (bot,) = ApiToken.objects.filter(name="deploy bot")
    assert bot.scopes == ["runs:write", "history:read"] and bot.created_by == admin
    assert engine.authenticate(key.group(1)) == bot
    # Shown once: the page does not show it again.
    assert key.group(1) not in client.get("/teams/finance/").content.decode()
    for bad in (
        {"name": "", "scopes": ["mcp"]},
        {"name": "x", "scopes": []},
        {"name": "x", "scopes": ["root"]},
    ):
        assert client.post("/teams/finance/tokens/", bad).status_code == 422, bad
    assert (
        client.post(
            "/teams/finance/tokens/", {"name": "x", "scopes": ["mcp"], "expires_in_days": "0"}
        ).status_code
        == 422
    )
    assert ApiToken.objects.count() == 1
    assert client.post(f"/teams/finance/tokens/{bot.pk}/revoke/").status_code == 302
    assert engine.authenticate(key.group(1)) is None

    # An approver neither sees the team's tokens nor makes one.
    approver = User.objects.create_user("apu")
    Membership.objects.create(team=team, user=approver, role=Role.APPROVER)
    other = Client()
    other.force_login(approver)
    assert "deploy bot" not in other.get("/teams/finance/").content.decode()
    refused = other.post("/teams/finance/tokens/", {"name": "mine", "scopes": ["mcp"]})
    assert refused.status_code == 403 and "you need the admin role" in refused.content.decode()
    assert ApiToken.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_tokens_made_before_scopes_keep_every_scope() -> None:
    executor = MigrationExecutor(connection)
    before, after = [("actions", "0022_membership_roles")], [("actions", "0023_token_scopes_expiry")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    old_team = old.get_model("actions", "Team").objects.create(name="Old", slug="old")
    old.get_model("actions", "ApiToken").objects.create(
        team=old_team, name="old", prefix="gl_x", key_hash="h"
    )
    try:
        executor.loader.build_graph()
        executor.migrate(after)
        migrated = executor.loader.project_state(after).apps.get_model("actions", "ApiToken")
        # Every scope there was then: those added since (gateway:write) are given to no old token.
        then = [scope for scope in Scope.of_a_team() if scope != Scope.GATEWAY_WRITE]
        assert migrated.objects.get(name="old").scopes == then
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.usefixtures("database")
def test_a_teams_admins_neither_see_nor_revoke_the_directorys_token(team: Team) -> None:
    admin = User.objects.create_user("ada")
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    directory, _ = ApiToken.issue(team, "dir-sync-token", [Scope.SCIM])
    client = Client()
    client.force_login(admin)
    assert "dir-sync-token" not in client.get("/teams/finance/").content.decode()
    refused = client.post(f"/teams/finance/tokens/{directory.pk}/revoke/")
    assert (
        refused.status_code == 403
        and "Only staff revoke a token with the scim scope" in refused.content.decode()
    )
    directory.refresh_from_db()
    assert directory.revoked_at is None
    staff = Client()
    staff.force_login(User.objects.create_user("root", is_staff=True))
    assert "dir-sync-token" in staff.get("/teams/finance/").content.decode()
