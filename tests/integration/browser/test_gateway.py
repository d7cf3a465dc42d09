"""The MCP gateway end to end, against `make run`'s server (daphne, its own step threads, SQLite)
and an upstream MCP server built with the official Python SDK (tests/mcp_upstream.py, a process of
its own that checks each receipt it gets with grundlag_client.receipts): agent hosts on the
official Python and TypeScript SDKs call its tools at /mcp/gateway/payments/; a reviewer approves
(once editing the arguments) and rejects in Chromium; the upstream runs each approved call once,
with the approved arguments and a receipt that verifies, and never a rejected one; a host that
sends a call again gets the first one's result."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from playwright.sync_api import Browser, expect

from grundlag_client.receipts import InvalidReceipt, fetch_jwks, verify_receipt
from tests.integration.browser.conftest import log_in
from tests.integration.browser.test_inbox_live import screenshot_dir
from tests.integration.processes import Server, Site, decide, free_port, wait_for_port
from tests.integration.test_mcp import (
    CreatedTask,
    TasksExtension,
    call_as_task,
    ended_task,
    get_task,
    http,
    legacy,
    task_result,
)
from tests.mcp_upstream import SECRET, calls

pytestmark = pytest.mark.integration

NODE_CLIENT = Path(__file__).parents[2] / "node" / "mcp_task.mjs"


def hosted(coroutine: Any) -> Any:
    """Run an agent host's coroutine to its end, in a thread of its own: Playwright's sync API
    keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=300)


def gateway(web: Server) -> str:
    return f"{web.url}/mcp/gateway/payments/"


def started(site: Site, tmp_path: Path) -> tuple[Server, Path]:
    """The site (calling 127.0.0.1 allowed), the upstream, and the upstream registered through
    the API with its credentials."""
    site.env.update(GRUNDLAG_WEBHOOK_ALLOW_PRIVATE="true", GRUNDLAG_MCP_WAIT_SECONDS="2")
    web = site.serve()
    # The upstream checks receipts with the Python client, from the repository (as pytest finds it).
    site.env["PYTHONPATH"] = str(Path(__file__).parents[3] / "clients" / "python" / "src")
    log, port = tmp_path / "upstream-calls.jsonl", free_port()
    upstream = site.spawn(
        "upstream", sys.executable, "-m", "tests.mcp_upstream", "--port", str(port), "--log", str(log),
        "--site", web.url,
    )  # fmt: skip
    wait_for_port(port, upstream)
    with web.client(site.token) as api:
        made = api.post(
            "/api/mcp-upstreams",
            json={
                "name": "payments",
                "url": f"http://127.0.0.1:{port}/mcp",
                "headers": {"Authorization": f"Bearer {SECRET}"},
                "tool_policies": {"lookup_order": "never"},
            },
        )
        assert made.status_code == 201, made.text
    return web, log


def pending_of(web: Server, site: Site, tool_arguments: dict[str, Any]) -> int:
    """The pending interrupt of the gateway call with these arguments."""
    with web.client(site.token) as api:
        for _ in range(400):
            for it in api.get("/api/interrupts", params={"status": "pending"}).json()["items"]:
                if it["action"].startswith("payments/") and it["data"]["arguments"] == tool_arguments:
                    return int(it["id"])
            time.sleep(0.05)
    raise AssertionError(f"no pending call with {tool_arguments}")


def test_hosts_call_through_the_gateway_and_people_decide_in_the_browser(
    site: Site, browser: Browser, tmp_path: Path
) -> None:
    web, log = started(site, tmp_path)
    asked = {"order_id": "ord_1", "amount": 120.5}

    async def first_call() -> tuple[set[str], types.CallToolResult, types.CallToolResult]:
        async with Client(streamable_http_client(gateway(web), http_client=http(site.token))) as host:
            tools = {tool.name for tool in (await host.list_tools()).tools}
            looked_up = await host.call_tool("lookup_order", {"order_id": "ord_0"})  # never ask
            waiting = await host.call_tool("refund", asked)
            return tools, looked_up, waiting

    tools, looked_up, waiting = hosted(first_call())
    assert {"refund", "lookup_order"} <= tools
    assert looked_up.structured_content == {"order_id": "ord_0", "status": "shipped"}, (looked_up, calls(log))
    # Held 2 s (GRUNDLAG_MCP_WAIT_SECONDS), then said to be pending: as an error result, which a
    # client checks against no output schema, saying the call has not run yet.
    assert waiting.is_error and waiting.structured_content is not None
    assert waiting.structured_content["status"] == "pending"
    assert "has not run yet" in waiting.content[0].text
    assert [each["tool"] for each in calls(log)] == ["lookup_order"]

    # A reviewer opens it in Chromium, edits the amount, and approves.
    interrupt = pending_of(web, site, asked)
    page = log_in(browser, web.url, "reviewer1")
    page.goto(f"/interrupts/{interrupt}/")
    expect(page.locator("main")).to_contain_text("Call refund on payments")
    page.locator("details.edit-call summary").click()
    page.locator('[name="edit"]').check()
    expect(page.locator('[name="edit-amount"]')).to_have_value("120.5")
    page.fill('[name="edit-amount"]', "100")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "gateway.png"), full_page=True)
    page.locator("form.approve-form button.approve").click()
    expect(page.locator("p.decided")).to_contain_text("approved by reviewer1")

    # The host sends the call again, as it would after its wait: it gets the first call's result.
    async def again() -> types.CallToolResult:
        async with Client(streamable_http_client(gateway(web), http_client=http(site.token))) as host:
            for _ in range(100):
                result = await host.call_tool("refund", asked)
                if (result.structured_content or {}).get("status") != "pending":
                    return result
            raise AssertionError("still pending")

    result = hosted(again())
    assert not result.is_error and result.structured_content == {"refunded": "ord_1", "amount": 100.0}
    refunds = [each for each in calls(log) if each["tool"] == "refund"]
    assert len(refunds) == 1, refunds  # once, for all the host's retries
    [made] = refunds
    assert made["arguments"] == {"order_id": "ord_1", "amount": 100.0}
    assert made["authorization"] == f"Bearer {SECRET}"
    assert made["receipt_verified"] is True, made.get("receipt_error")
    assert made["approved_by"][0]["name"] == "reviewer1"
    with pytest.raises(InvalidReceipt, match="other arguments"):
        verify_receipt(
            made["receipt"], fetch_jwks(web.url), asked, team="demo"
        )  # as the host asked, not as approved

    # Another call, as a 2025-11-25 task: rejected in the browser, it never reaches the upstream.
    other = {"order_id": "ord_2", "amount": 5000}

    async def as_task() -> tuple[types.CreateTaskResult, types.GetTaskResult]:
        async with legacy(web, site.token, gateway(web)) as (session, dispatcher):
            created = await call_as_task(dispatcher, "refund", other)
            return created, await get_task(session, created.task.task_id)

    created, status = hosted(as_task())
    assert status.status == "working"
    page.goto(f"/interrupts/{pending_of(web, site, other)}/")
    page.locator("summary:has-text('Reject')").first.click()
    page.fill('[name="reject-reason"]', "too much for one refund")
    page.locator("form.reject-form button").first.click()
    expect(page.locator("p.decided")).to_contain_text("rejected")

    async def result_of_task() -> types.CallToolResult:
        async with legacy(web, site.token, gateway(web)) as (session, _):
            return await task_result(session, created.task.task_id)

    rejected: types.CallToolResult = hosted(result_of_task())
    assert rejected.is_error and "too much for one refund" in json.dumps(rejected.model_dump(mode="json"))
    assert [each["arguments"]["order_id"] for each in calls(log) if each["tool"] == "refund"] == ["ord_1"]


def test_the_typescript_sdk_calls_through_the_gateway_as_a_task(site: Site, tmp_path: Path) -> None:
    web, log = started(site, tmp_path)
    asked = {"order_id": "ord_ts", "amount": 42}
    host = subprocess.Popen(
        ["node", str(NODE_CLIENT), gateway(web), site.token, "refund", json.dumps(asked)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    decide(web, pending_of(web, site, asked))  # reviewer1 approves on the page's form
    out, err = host.communicate(timeout=120)
    assert host.returncode == 0, err
    said = [json.loads(line) for line in out.splitlines()]
    assert {tool["name"] for tool in said[0]["tools"]} >= {"refund", "lookup_order"}
    assert said[1]["type"] == "taskCreated"
    assert said[-1]["type"] == "result", said[-1]
    assert said[-1]["result"]["structuredContent"] == {"refunded": "ord_ts", "amount": 42}
    [made] = calls(log)
    assert made["arguments"] == {"order_id": "ord_ts", "amount": 42.0} and made["receipt_verified"] is True


def test_a_2026_client_with_the_tasks_extension_gets_the_upstreams_result_through_the_task(
    site: Site, tmp_path: Path
) -> None:
    web, log = started(site, tmp_path)
    asked = {"order_id": "ord_26", "amount": 7.25}

    async def scenario() -> types.CallToolResult:
        connection = streamable_http_client(gateway(web), http_client=http(site.token))
        async with Client(connection, extensions=[TasksExtension()]) as host:
            created = await host.session.call_tool("refund", asked, allow_claimed=True)
            assert isinstance(created, CreatedTask) and created.status == "working"
            interrupt = await asyncio.to_thread(pending_of, web, site, asked)
            await asyncio.to_thread(decide, web, interrupt)
            got = await ended_task(host.session, created.task_id)
            assert got.status == "completed" and got.result is not None
            return types.CallToolResult.model_validate(got.result, by_name=False)

    result = hosted(scenario())
    assert not result.is_error and result.structured_content == {"refunded": "ord_26", "amount": 7.25}
    [made] = calls(log)
    assert made["arguments"] == asked and made["receipt_verified"] is True
