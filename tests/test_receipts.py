"""Approval receipts (actions.engine.receipts): fetched from the API on a decided interrupt and
approval, checked offline with the Python client's verify_receipt against /.well-known/jwks.json;
keys rotated and revoked; the arguments' canonical form the same as the clients'. And the API's
MCP upstreams (POST/GET/DELETE /api/mcp-upstreams) with their scope."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from actions import engine
from actions.engine import receipts, sealed
from actions.models import ApiToken, Interrupt, McpUpstream, ReceiptKey, Run, Scope, Team
from grundlag_client import receipts as client_receipts
from grundlag_client.receipts import InvalidReceipt, verify_receipt
from tests.test_api import Api

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]


@pytest.fixture
def api(client: Client, token_key: str) -> Api:
    return Api(client, token_key)


def jwks(client: Client) -> dict[str, Any]:
    response = client.get("/.well-known/jwks.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/jwk-set+json"
    assert response["Access-Control-Allow-Origin"] == "*"
    return dict(response.json())


def transfer(team: Team, amount: float = 250) -> Interrupt:
    run = engine.start_run("transfer_funds", {"amount": amount, "to": "DE12"}, team, None)
    return Interrupt.objects.get(run=run)


def test_a_decided_interrupt_has_a_receipt_that_verifies_offline(
    api: Api, client: Client, team: Team, reviewer: User, settings: Any
) -> None:
    it = transfer(team)
    pending = api.get(f"/interrupts/{it.pk}").json()
    assert pending["status"] == "pending" and pending["receipt"] is None
    engine.approve(it, {"approved": True, "comment": "fine"}, reviewer)
    read = api.get(f"/interrupts/{it.pk}").json()
    assert read["status"] == "approved"
    run = Run.objects.get(pk=it.run_id)
    said = verify_receipt(read["receipt"], jwks(client), run.input, action="transfer_funds", team="finance")
    assert (said.run, said.interrupt, said.decided_via) == (run.pk, it.pk, "dashboard")
    assert said.answer == {"approved": True, "comment": "fine"}
    assert said.approved_by[0]["name"] == "reviewer1"
    assert said.issuer == settings.GRUNDLAG_BASE_URL.rstrip("/")
    # The same receipt whenever it is asked for (Ed25519 is deterministic): one id per call.
    assert api.get(f"/interrupts/{it.pk}").json()["receipt"] == read["receipt"]
    for wrong, why in [
        ({**run.input, "amount": 251}, "other arguments"),
    ]:
        with pytest.raises(InvalidReceipt, match=why):
            verify_receipt(read["receipt"], jwks(client), wrong, team="finance")
    with pytest.raises(InvalidReceipt, match="team"):
        verify_receipt(read["receipt"], jwks(client), run.input, team="payroll")
    with pytest.raises(ValueError, match="audience"):
        verify_receipt(read["receipt"], jwks(client), run.input)  # for whom?
    assert said.audience == f"{settings.GRUNDLAG_BASE_URL}/teams/finance/"
    seen: set[str] = set()
    verify_receipt(read["receipt"], jwks(client), run.input, team="finance", seen=seen)
    with pytest.raises(InvalidReceipt, match="used already"):
        verify_receipt(read["receipt"], jwks(client), run.input, team="finance", seen=seen)
    later = timezone.now().timestamp() + 3600 + 120
    with pytest.raises(InvalidReceipt, match="expired"):
        verify_receipt(read["receipt"], jwks(client), run.input, team="finance", now=later)


def test_a_rejected_interrupt_has_none_and_another_teams_is_not_found(
    api: Api, team: Team, other_team: Team, reviewer: User, outsider: User
) -> None:
    it = transfer(team)
    engine.reject(it, "no", reviewer)
    assert api.get(f"/interrupts/{it.pk}").json()["receipt"] is None
    theirs = transfer(other_team)
    assert api.get(f"/interrupts/{theirs.pk}").status_code == 404


def test_an_approved_approval_carries_its_receipt_bound_to_the_question(
    api: Api, client: Client, reviewer: User
) -> None:
    asked = api.post("/approvals", {"message": "Ship it?", "data": {"version": "2.4"}}, wait=None).json()
    assert asked["receipt"] is None
    engine.approve(Interrupt.objects.get(pk=asked["interrupt_id"]), {"approved": True}, reviewer)
    approval = api.get(f"/approvals/{asked['id']}").json()
    question = {"message": "Ship it?", "data": {"version": "2.4"}, "answer_schema": None}
    said = verify_receipt(approval["receipt"], jwks(client), question, team="finance", action="approval")
    assert said.interrupt == asked["interrupt_id"]


def test_rotation_keeps_old_receipts_good_until_they_expire_and_revoking_ends_them(
    api: Api, client: Client, team: Team, reviewer: User, settings: Any
) -> None:
    it = transfer(team)
    engine.approve(it, {"approved": True}, reviewer)
    old = api.get(f"/interrupts/{it.pk}").json()["receipt"]
    arguments = Run.objects.get(pk=it.run_id).input
    # The key that signed it (other keys may be in the database: a test's thread commits its own).
    first = json.loads(client_receipts_header(old))["kid"]
    assert first in kids(client)
    ReceiptKey.objects.update(created_at=timezone.now() - timedelta(days=30))  # keys in use a while
    call_command("receipt_keys", "rotate")
    [newest] = ReceiptKey.objects.filter(retired_at=None, revoked_at=None).values_list("kid", flat=True)
    assert {first, newest} <= kids(client)  # the next key is published before it signs
    # For JWKS_MAX_AGE, the old key still signs: a verifier's cached key set has the next one
    # before it signs anything.
    assert api.get(f"/interrupts/{it.pk}").json()["receipt"] == old
    ahead = receipts.PUBLISHED_AHEAD + timedelta(seconds=1)
    ReceiptKey.objects.filter(kid=newest).update(created_at=timezone.now() - ahead)
    ReceiptKey.objects.exclude(kid=newest).update(retired_at=timezone.now() - timedelta(seconds=1))
    new = api.get(f"/interrupts/{it.pk}").json()["receipt"]
    assert json.loads(client_receipts_header(new))["kid"] == newest
    verify_receipt(old, jwks(client), arguments, team="finance")  # the retired key, still published
    verify_receipt(new, jwks(client), arguments, team="finance")
    # Past the receipts' lifetime, the retired key is withdrawn.
    ReceiptKey.objects.filter(kid=first).update(
        retired_at=timezone.now() - timedelta(seconds=settings.GRUNDLAG_RECEIPT_SECONDS + 1)
    )
    assert first not in kids(client)
    with pytest.raises(InvalidReceipt, match="not signed"):
        verify_receipt(old, jwks(client), arguments, team="finance")
    # Revoked: at once.
    call_command("receipt_keys", "revoke", "--", newest)  # a kid may start with "-"
    assert newest not in kids(client)
    with pytest.raises(InvalidReceipt, match="not signed"):
        verify_receipt(new, jwks(client), arguments, team="finance")
    assert receipts.signing_key().kid not in (newest, first)  # a fresh key signs


def kids(client: Client) -> set[str]:
    return {key["kid"] for key in jwks(client)["keys"]}


def client_receipts_header(receipt: str) -> str:
    import base64

    head = receipt.split(".")[0]
    return base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)).decode()


def test_a_key_whose_id_starts_with_a_dash_is_revoked_from_the_command_line(capsys: Any) -> None:
    """A kid is a base64url thumbprint: one in 64 starts with "-", which argparse takes for an
    option unless it follows "--", as the command's help says."""
    key = receipts.signing_key()
    ReceiptKey.objects.filter(kid=key.kid).update(kid="-" + key.kid[1:])
    call_command("receipt_keys", "revoke", "--", "-" + key.kid[1:])
    assert ReceiptKey.objects.get(kid="-" + key.kid[1:]).revoked_at is not None
    assert "revoked" in capsys.readouterr().out


@pytest.mark.parametrize(
    "value",
    [
        {"b": [1, 2.0, 1e-7, 1e21, 0.1, -0.0, "é\n"], "a": None, "é": True},
        {"amount": 100.0, "big": 12345678901234567890, "tiny": 5e-324, "neg": -1.5e-10, "x": 1e20},
        ["\u2028", "\U0001f600", {"\U0001f600": 1, "\ufb33": 2}],
    ],
)
def test_the_server_and_the_client_write_the_same_canonical_form(value: Any) -> None:
    assert receipts.canonical_json(value) == client_receipts.canonical_json(value)


def test_the_canonical_form_is_the_one_the_typescript_client_writes() -> None:
    # The same value and text as clients/typescript/test/client.test.mjs asserts of canonicalJson.
    value = {"b": [1, 2.0, 1e-7, 1e21, 0.1, -0.0, "é\n"], "a": None, "é": True}
    assert receipts.canonical_json(value) == '{"a":null,"b":[1,2,1e-7,1e+21,0.1,0,"é\\n"],"é":true}'


def test_sealed_values_open_after_secret_key_rotation_with_a_fallback(settings: Any) -> None:
    token = sealed.seal("hunter2")
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-key-" + "x" * 40
    assert sealed.unseal(token) == "hunter2"
    assert sealed.unseal(sealed.seal("new")) == "new"
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(sealed.Unreadable, match="SECRET_KEY_FALLBACKS"):
        sealed.unseal(token)


# The API's upstreams


def test_mcp_upstreams_are_registered_listed_and_removed_with_their_scope(
    client: Client, team: Team, settings: Any
) -> None:
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True
    key = ApiToken.issue(team, "admin-bot", [Scope.GATEWAY_WRITE])[1]
    api = Api(client, key)
    body = {
        "name": "payments",
        "url": "http://127.0.0.1:9/mcp",
        "headers": {"Authorization": "Bearer upstream"},
        "tool_policies": {"refund": "ask"},
    }
    made = api.post("/mcp-upstreams", body, wait=None)
    assert made.status_code == 201, made.content
    out = made.json()
    assert (out["gateway_path"], out["header_names"], out["tool_policies"]) == (
        "/mcp/gateway/payments/", ["Authorization"], {"refund": "ask"},
    )  # fmt: skip
    assert "Bearer upstream" not in made.content.decode()
    assert [each["name"] for each in api.get("/mcp-upstreams").json()] == ["payments"]
    again = api.post("/mcp-upstreams", body, wait=None)
    assert again.status_code == 422 and "already taken" in json.dumps(again.json())
    bad = api.post("/mcp-upstreams", {**body, "name": "x", "headers": {"Content-Type": "a"}}, wait=None)
    assert bad.status_code == 422 and "Content-Type" in json.dumps(bad.json())
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = False
    private = api.post("/mcp-upstreams", {**body, "name": "local"}, wait=None)
    assert private.status_code == 422 and "private" in json.dumps(private.json())
    without = Api(client, ApiToken.issue(team, "mcp-only", [Scope.MCP])[1])
    refused = without.post("/mcp-upstreams", {**body, "name": "other"}, wait=None)
    assert refused.status_code == 403 and "gateway:write" in json.dumps(refused.json())
    assert (
        api.client.delete(
            "/api/mcp-upstreams/payments", headers={"Authorization": f"Bearer {key}"}
        ).status_code
        == 204
    )
    assert (
        api.client.delete(
            "/api/mcp-upstreams/payments", headers={"Authorization": f"Bearer {key}"}
        ).status_code
        == 404
    )
    assert not McpUpstream.objects.exists()


def test_the_command_line_adds_lists_sets_a_policy_and_removes(
    team: Team, settings: Any, capsys: Any
) -> None:
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True
    call_command(
        "mcp_upstream", "add", "finance", "payments", "http://127.0.0.1:9/mcp", "--header", "X-Key: k1"
    )
    out = capsys.readouterr()
    assert "/mcp/gateway/payments/" in out.out and "could not be asked" in out.err  # nobody listens on :9
    upstream = McpUpstream.objects.get(team=team, name="payments")
    assert upstream.header_names == ["X-Key"] and upstream.tools_error
    call_command("mcp_upstream", "policy", "finance", "payments", "never", "--tool", "lookup_order")
    upstream.refresh_from_db()
    assert upstream.policy_for("lookup_order") == "never" and upstream.policy_for("refund") == "rules"
    call_command("mcp_upstream", "list", "finance")
    assert "payments" in capsys.readouterr().out
    call_command("mcp_upstream", "remove", "finance", "payments")
    assert not McpUpstream.objects.exists()
