"""The MCP gateway's engine and driver (actions.engine.gateway, actions.drivers.gateway) against a
real upstream MCP server built with the official SDK (tests/mcp_upstream.py, in a thread), and its
composition with the team's rules, grants, policies and N-of-M approvals: on SQLite and PostgreSQL,
with worker and inline steps. The MCP endpoint itself is judged by the SDK's clients in
tests/integration/browser/test_gateway.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from actions import engine
from actions.drivers.gateway import GatewayDriver
from actions.engine import gateway, sealed
from actions.engine.queue import answers_of
from actions.models import (
    ApiToken,
    GatewayCall,
    Interrupt,
    McpUpstream,
    Membership,
    Policy,
    Role,
    Run,
    RunEvent,
    Scope,
    Team,
    TeamRule,
)
from grundlag_client.receipts import InvalidReceipt, verify_receipt
from tests.conftest import member
from tests.mcp_upstream import SECRET, Upstream

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.usefixtures("steps", "database")]

ORDER = {"order_id": "ord_1", "amount": 120.5}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def upstream_server(tmp_path: Path, settings: Any) -> Iterator[Upstream]:
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True  # it listens on 127.0.0.1
    with Upstream(free_port(), tmp_path / "calls.jsonl") as server:
        yield server


@pytest.fixture
def token(team: Team) -> ApiToken:
    return ApiToken.issue(team, "agent-host")[0]


@pytest.fixture
def payments(team: Team, upstream_server: Upstream) -> McpUpstream:
    upstream = gateway.register(
        team, "payments", upstream_server.url, {"Authorization": f"Bearer {SECRET}"}, by=None
    )
    upstream.tools = [
        {"name": "refund", "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"},
         "amount": {"type": "number"}}, "required": ["order_id", "amount"]}},
        {"name": "lookup_order", "inputSchema": {"type": "object"}},
    ]  # fmt: skip
    upstream.save(update_fields=["tools"])
    return upstream


def call(token: ApiToken, upstream: McpUpstream, tool: str = "refund", arguments: Any = None) -> Run:
    run, _ = gateway.start_call(token, upstream, tool, dict(ORDER if arguments is None else arguments))
    run.refresh_from_db()
    return run


def verified(receipt: str, arguments: Any, **expected: Any) -> Any:
    """What the receipt says, checked as the upstream checks it (for its own URL)."""
    expected.setdefault("audience", McpUpstream.objects.get(name="payments").url)
    return verify_receipt(receipt, engine.receipts.jwks(), arguments, **expected)


def pending(run: Run) -> Interrupt:
    return Interrupt.objects.get(run=run, status=Interrupt.Status.PENDING)


def test_a_call_waits_for_a_person_and_then_reaches_the_upstream_once_with_a_receipt(
    team: Team, token: ApiToken, payments: McpUpstream, upstream_server: Upstream, reviewer: User
) -> None:
    run = call(token, payments)
    assert run.status == Run.Status.INTERRUPTED
    it = pending(run)
    assert (it.action, it.data["tool"], it.data["arguments"]) == ("payments/refund", "refund", ORDER)
    assert upstream_server.calls() == []

    engine.approve(it, None, reviewer, via="dashboard")
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.error
    assert run.output["structuredContent"] == {"refunded": "ord_1", "amount": 120.5}
    [made] = upstream_server.calls()
    assert made["arguments"] == ORDER
    assert made["authorization"] == f"Bearer {SECRET}"  # its credentials, unsealed for the call
    said = verified(made["receipt"], ORDER, action="payments/refund", team="finance")
    assert said.approved_by[0]["name"] == "reviewer1"
    assert said.run == run.pk and said.interrupt == it.pk
    with pytest.raises(InvalidReceipt, match="other arguments"):
        verified(made["receipt"], {**ORDER, "amount": 9999})

    # The step again (a redelivered message, a worker lost after the call): never a second call.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.QUEUED)

    result = GatewayDriver().step(Run.objects.get(pk=run.pk), answers_of(run.pk))
    assert result.status == Run.Status.FAILED and "not made twice" in result.error
    assert len(upstream_server.calls()) == 1


def test_a_rejected_call_never_reaches_the_upstream(
    token: ApiToken, payments: McpUpstream, upstream_server: Upstream, reviewer: User
) -> None:
    run = call(token, payments)
    engine.reject(pending(run), "Not this order", reviewer)
    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.REJECTED, "Not this order")
    assert engine.receipts.receipt_for(Interrupt.objects.get(run=run)) is None
    assert upstream_server.calls() == []


def test_an_edited_call_runs_with_the_reviewers_arguments_and_its_receipt_binds_them(
    token: ApiToken, payments: McpUpstream, upstream_server: Upstream, reviewer: User
) -> None:
    run = call(token, payments)
    it = pending(run)
    assert engine.proposed_arguments(it) == ORDER
    with pytest.raises(engine.InvalidInput, match="input schema"):
        engine.approve(it, None, reviewer, arguments={"order_id": "ord_1"})  # amount is required
    edited = {"order_id": "ord_1", "amount": 20}
    engine.approve(it, None, reviewer, arguments=edited)
    [made] = upstream_server.calls()
    assert made["arguments"] == {"order_id": "ord_1", "amount": 20.0}
    verified(made["receipt"], edited)
    with pytest.raises(InvalidReceipt):
        verified(made["receipt"], ORDER)


def test_the_same_call_again_before_its_result_was_given_joins_the_first(
    token: ApiToken, payments: McpUpstream, reviewer: User
) -> None:
    first, joined = gateway.start_call(token, payments, "refund", dict(ORDER))
    again, joined_again = gateway.start_call(token, payments, "refund", dict(ORDER))
    assert (joined, joined_again, again.pk) == (False, True, first.pk)
    other, joined_other = gateway.start_call(token, payments, "refund", {**ORDER, "amount": 1})
    assert not joined_other and other.pk != first.pk
    engine.approve(pending(first), None, reviewer)
    again, joined_again = gateway.start_call(token, payments, "refund", dict(ORDER))
    assert joined_again and again.pk == first.pk  # finished, not yet given to the host
    gateway.delivered(first.pk, token)
    fresh, joined_fresh = gateway.start_call(token, payments, "refund", dict(ORDER))
    assert not joined_fresh and fresh.pk != first.pk
    assert GatewayCall.objects.filter(upstream=payments).count() == 3


def test_each_tools_policy_against_the_teams_rules(
    team: Team, token: ApiToken, payments: McpUpstream, upstream_server: Upstream
) -> None:
    TeamRule.objects.create(
        team=team,
        name="small refunds",
        when="action == 'payments/refund' && input.amount < 500",
        then="approve",
    )
    TeamRule.objects.create(
        team=team,
        name="no ord_9",
        when="input.order_id == 'ord_9'",
        then="reject",
        reason="ord_9 is under investigation",
    )
    # rules decide (the default): the rule approves, the call is made at once.
    run = call(token, payments)
    assert run.status == Run.Status.COMPLETED, run.error
    it = Interrupt.objects.get(run=run)
    assert (it.decided_by_name, it.decided_via) == ("rule: small refunds", "rule")
    receipt = upstream_server.calls()[-1]["receipt"]
    assert verified(receipt, ORDER).decided_via == "rule"
    # A rule that rejects: the upstream never hears of it.
    run = call(token, payments, "lookup_order", {"order_id": "ord_9"})
    assert (run.status, run.error) == (Run.Status.REJECTED, "ord_9 is under investigation")
    assert len(upstream_server.calls()) == 1
    # always ask: the approving rule may not approve it; a person must.
    gateway.set_policy(payments, "refund", McpUpstream.Policy.ASK, by=None)
    payments.refresh_from_db()
    run = call(token, payments, arguments={"order_id": "ord_2", "amount": 5})
    assert run.status == Run.Status.INTERRUPTED
    paused = RunEvent.objects.get(run=run, kind=RunEvent.Kind.INTERRUPTED)
    assert "may not be approved automatically" in paused.detail["rule_failed"]["error"]
    assert "takes no grant" in engine.why_no_grant(pending(run))  # nor a standing grant, later
    # never ask: straight through, approved by the tool's own rule, after the team's (which
    # still reject: ord_9 never reaches the upstream, whatever the tool's policy).
    gateway.set_policy(payments, "lookup_order", McpUpstream.Policy.NEVER, by=None)
    payments.refresh_from_db()
    run = call(token, payments, "lookup_order", {"order_id": "ord_3"})
    assert run.status == Run.Status.COMPLETED, run.error
    assert Interrupt.objects.get(run=run).decided_by_name == "rule: never ask (the tool's policy)"
    last = upstream_server.calls()[-1]
    assert last["tool"] == "lookup_order"
    assert verified(last["receipt"], {"order_id": "ord_3"}).action == "payments/lookup_order"
    run = call(token, payments, "lookup_order", {"order_id": "ord_9"})
    assert (run.status, run.error) == (Run.Status.REJECTED, "ord_9 is under investigation")
    assert [each["arguments"] for each in upstream_server.calls()].count({"order_id": "ord_9"}) == 0


def test_no_token_approves_a_gateway_call_and_a_receipt_is_for_its_upstream_alone(
    team: Team, token: ApiToken, payments: McpUpstream, upstream_server: Upstream, reviewer: User
) -> None:
    run = call(token, payments)
    it = pending(run)
    deciding = ApiToken.issue(team, "decider", [Scope.INTERRUPTS_DECIDE])[0]
    for by in (token, deciding):
        with pytest.raises(engine.NotAllowed):
            engine.approve(it, None, by)
    engine.approve(it, None, reviewer)
    [made] = upstream_server.calls()
    said = verified(made["receipt"], ORDER)
    assert said.audience == payments.url
    # A receipt made for one team's server is refused by another's, though every team's are
    # signed with the site's keys.
    with pytest.raises(InvalidReceipt, match="audience"):
        verified(made["receipt"], ORDER, audience="https://payments.other-team.example/mcp")


def test_removing_an_upstream_cancels_its_calls_waiting_for_a_decision(
    token: ApiToken, payments: McpUpstream, upstream_server: Upstream
) -> None:
    run = call(token, payments)
    gateway.remove(payments, by=None)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert Interrupt.objects.get(run=run).status == Interrupt.Status.CANCELLED
    assert upstream_server.calls() == []


def test_a_retry_joins_only_a_recent_call_not_cancelled(
    token: ApiToken, payments: McpUpstream, settings: Any
) -> None:
    waiting, _ = gateway.start_call(token, payments, "refund", {**ORDER, "amount": 2})
    GatewayCall.objects.filter(run=waiting).update(
        created_at=timezone.now() - timedelta(seconds=settings.GRUNDLAG_GATEWAY_RETRY_SECONDS + 1)
    )
    # Still waiting for its decision, an old call is joined however long that takes.
    assert gateway.start_call(token, payments, "refund", {**ORDER, "amount": 2}) == (waiting, True)
    first, _ = gateway.start_call(token, payments, "refund", dict(ORDER))
    engine.cancel(first, token)
    second, joined = gateway.start_call(token, payments, "refund", dict(ORDER))
    assert not joined and second.pk != first.pk
    Run.objects.filter(pk=second.pk).update(status=Run.Status.COMPLETED)  # finished, never fetched
    GatewayCall.objects.filter(run=second).update(
        created_at=timezone.now() - timedelta(seconds=settings.GRUNDLAG_GATEWAY_RETRY_SECONDS + 1)
    )
    third, joined = gateway.start_call(token, payments, "refund", dict(ORDER))
    assert not joined and third.pk != second.pk


def test_an_edit_form_keeps_arguments_named_like_schema_keywords(team: Team) -> None:
    schema = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "pattern": "^(a+)+$"}, "limit": {"type": "integer"}},
        "required": ["pattern"],
        "additionalProperties": False,
    }
    editable = gateway.editable_schema(schema)
    assert editable["properties"]["pattern"] == {"type": "string"}  # the argument stays; its regex goes
    assert editable["required"] == ["pattern"]
    assert gateway.editable_schema(["not", "a", "schema"]) == {"type": "object"}


def test_four_eyes_on_a_tool_even_with_a_null_answer(
    team: Team, token: ApiToken, payments: McpUpstream, upstream_server: Upstream, reviewer: User,
    second_reviewer: User,
) -> None:  # fmt: skip
    Policy.objects.create(team=team, action="payments/refund", approvals_required=2)
    run = call(token, payments)
    it = pending(run)
    assert it.approvals_required == 2
    engine.approve(it, None, reviewer)
    assert upstream_server.calls() == []
    engine.approve(pending(run), None, second_reviewer)
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED, run.error
    [made] = upstream_server.calls()
    said = verified(made["receipt"], ORDER)
    assert [each["name"] for each in said.approved_by] == ["reviewer1", "reviewer2"]


def test_only_a_team_admin_registers_and_what_is_refused(
    team: Team, reviewer: User, upstream_server: Upstream, settings: Any
) -> None:
    with pytest.raises(engine.NotAllowed, match="admin role"):
        gateway.register(team, "payments", upstream_server.url, by=reviewer)
    Membership.objects.filter(team=team, user=reviewer).update(role=Role.ADMIN)
    made = gateway.register(
        team, "payments", upstream_server.url, {"Authorization": "Bearer s3cret"}, by=reviewer
    )
    raw = McpUpstream.objects.filter(pk=made.pk).values_list("headers_sealed", flat=True).get()
    assert "s3cret" not in raw and gateway.headers_of(made) == {"Authorization": "Bearer s3cret"}
    assert sealed.unseal(raw) == '{"Authorization": "Bearer s3cret"}'
    for name, url, headers, said in [
        ("payments", upstream_server.url, None, "already has"),
        ("Pay Ments", upstream_server.url, None, "lower-case"),
        ("ok", "ftp://example.com/mcp", None, "http"),
        ("ok", upstream_server.url, {"Host": "evil"}, "sets Host itself"),
        ("ok", upstream_server.url, {"X-Key": "a\r\nb"}, "line break"),
        ("ok", upstream_server.url, {"X-Key": "Bearer s\x0b1"}, "control character"),
    ]:
        with pytest.raises(engine.InvalidInput, match=said):
            gateway.register(team, name, url, headers, by=reviewer)
    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(engine.InvalidInput, match="private, loopback"):
        gateway.register(team, "local", upstream_server.url, by=reviewer)
    assert McpUpstream.objects.filter(team=team).count() == 1


def test_an_upstream_that_cannot_be_reached_fails_the_call_saying_why(
    token: ApiToken, payments: McpUpstream, reviewer: User
) -> None:
    McpUpstream.objects.filter(pk=payments.pk).update(url=f"http://127.0.0.1:{free_port()}/mcp")
    run = call(token, payments)
    engine.approve(pending(run), None, reviewer)
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "could not be called" in run.error and "payments" in run.error


def test_a_team_admin_manages_the_gateway_on_the_team_page(
    team: Team, reviewer: User, upstream_server: Upstream, token: ApiToken
) -> None:
    from django.test import Client

    admin = member(team, "admin1")
    Membership.objects.filter(team=team, user=admin).update(role=Role.ADMIN)
    browser, approver = Client(), Client()
    browser.force_login(admin)
    approver.force_login(reviewer)
    form = {"name": "payments", "url": upstream_server.url, "headers": f"Authorization: Bearer {SECRET}",
            "default_policy": "rules"}  # fmt: skip
    assert approver.post("/teams/finance/gateway/", form).status_code == 403
    assert not McpUpstream.objects.exists()
    added = browser.post("/teams/finance/gateway/", form)
    assert added.status_code == 302 and added["Location"] == "/teams/finance/gateway/payments/"
    page = browser.get("/teams/finance/gateway/payments/")
    text = page.content.decode()
    assert 'id="tool-refund"' in text and 'id="tool-lookup_order"' in text  # listed by the server itself
    assert SECRET not in text and "Authorization" in text  # its name, never its value
    assert approver.get("/teams/finance/gateway/payments/").status_code == 404
    saved = browser.post(
        "/teams/finance/gateway/payments/policies/",
        {"default_policy": "rules", "policy-refund": "ask", "policy-lookup_order": ""},
    )
    assert saved.status_code == 302
    upstream = McpUpstream.objects.get(name="payments")
    assert (upstream.policy_for("refund"), upstream.policy_for("lookup_order")) == ("ask", "rules")
    # A paused call's page offers its arguments to edit, as the tool's schema describes them.
    run = call(token, upstream)
    decision = browser.get(f"/interrupts/{pending(run).pk}/").content.decode()
    assert 'name="edit-amount"' in decision and 'name="edit-order_id"' in decision
    assert browser.post("/teams/finance/gateway/payments/remove/").status_code == 302
    assert not McpUpstream.objects.exists()
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_the_tools_are_asked_for_again_when_the_server_says_they_changed(
    token: ApiToken, payments: McpUpstream, upstream_server: Upstream
) -> None:
    from actions.drivers.gateway import refresh_tools

    listed = refresh_tools(payments)
    assert {"refund", "lookup_order", "reload_catalogue"} <= {tool["name"] for tool in listed}
    payments.refresh_from_db()
    assert payments.tools_fetched_at is not None and payments.tools_error == ""
    gateway.set_policy(payments, "reload_catalogue", McpUpstream.Policy.NEVER, by=None)
    payments.refresh_from_db()
    run = call(token, payments, "reload_catalogue", {})
    assert run.status == Run.Status.COMPLETED, run.error
    payments.refresh_from_db()
    assert payments.tools_fetched_at is None  # heard in the call's exchange: asked at the next listing


def test_a_server_that_never_listed_its_tools_is_asked_again_and_says_why_not(
    team: Team, settings: Any
) -> None:
    from actions.drivers.gateway import UpstreamFailed, refresh_tools

    settings.GRUNDLAG_WEBHOOK_ALLOW_PRIVATE = True
    down = gateway.register(team, "down", f"http://127.0.0.1:{free_port()}/mcp", by=None)
    with pytest.raises(UpstreamFailed):
        refresh_tools(down)
    down.refresh_from_db()
    assert down.tools == [] and down.tools_fetched_at is None and "Connect" in down.tools_error


def test_the_admin_sets_a_policy_for_a_gateway_tool_and_it_applies(
    team: Team,
    token: ApiToken,
    payments: McpUpstream,
    reviewer: User,
    second_reviewer: User,
    admin_client: Any,
) -> None:
    form = {
        "team": team.pk,
        "action": "payments/refund",
        "approvals_required": 2,
        "requester_may_approve": "unknown",
    }
    refused = admin_client.post("/admin/actions/policy/add/", {**form, "action": "elsewhere/refund"})
    assert refused.status_code == 200 and "tool of the team&#x27;s MCP" in refused.content.decode()
    saved = admin_client.post("/admin/actions/policy/add/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    it = pending(call(token, payments))
    assert it.approvals_required == 2
