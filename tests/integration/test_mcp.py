"""The MCP endpoint (/mcp/) with the official `mcp` SDK's own client, against `make run`'s server
(daphne, its own step threads, SQLite): the team's actions as tools, calls that pause as tasks
(2025-11-25 core tasks and the 2026-07-28 tasks extension) decided by a reviewer in the browser's
way, durable across a restart of the server, and bad calls refused creating nothing."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from tests.integration.processes import Server, Site, decide, stop

pytestmark = pytest.mark.integration

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
INVOICE = {"invoice_id": "MCP-1", "amount": 12.5}


def http(token: str) -> httpx2.AsyncClient:
    # The SDK's transport on an httpx2 client of ours: its default timeout (5 s) is too short for
    # a call the server holds while it waits.
    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=120)
    )


def mcp_url(web: Server) -> str:
    return f"{web.url}/mcp/"


def api(web: Server, site: Site) -> httpx.Client:
    return web.client(site.token)


def pending_interrupt(web: Server, site: Site, run_id: int) -> int:
    with api(web, site) as client:
        for _ in range(200):
            detail = client.get(f"/api/runs/{run_id}").json()
            if detail["interrupt"]:
                return int(detail["interrupt"]["id"])
            time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not pause")


def runs(web: Server, site: Site) -> list[dict[str, Any]]:
    with api(web, site) as client:
        items: list[dict[str, Any]] = client.get(
            "/api/runs", params={"consumer": "mcp", "limit": 200}
        ).json()["items"]
        return items


# 2025-11-25: the SDK's client has no tasks API; a task-augmented call goes through a
# dispatcher of ours, tasks/* through session.send_request.


@asynccontextmanager
async def legacy(
    web: Server, token: str, url: str = ""
) -> AsyncIterator[tuple[ClientSession, JSONRPCDispatcher[Any]]]:
    """A 2025-11-25 session with /mcp/ (or ``url``: the gateway's)."""
    async with (
        http(token) as client,
        streamable_http_client(url or mcp_url(web), http_client=client) as (read, write),
    ):
        dispatcher = JSONRPCDispatcher(read, write)
        async with ClientSession(dispatcher=dispatcher) as session:
            await session.initialize()
            yield session, dispatcher


async def call_as_task(
    dispatcher: JSONRPCDispatcher[Any], name: str, arguments: dict[str, Any]
) -> types.CreateTaskResult:
    raw = await dispatcher.send_raw_request(
        "tools/call", {"name": name, "arguments": arguments, "task": {"ttl": 60000}}
    )
    return types.CreateTaskResult.model_validate(raw, by_name=False)


async def get_task(session: ClientSession, task_id: str) -> types.GetTaskResult:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, types.GetTaskResult)


async def task_result(session: ClientSession, task_id: str) -> types.CallToolResult:
    request = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
    return await session.send_request(request, types.CallToolResult)


def test_the_teams_actions_are_tools_with_their_input_schemas(site: Site) -> None:
    web = site.serve()

    async def listed() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(
            streamable_http_client(mcp_url(web), http_client=http(site.token)), mode="legacy"
        ) as old:
            legacy_tools = {tool.name: tool for tool in (await old.list_tools()).tools}
        async with Client(streamable_http_client(mcp_url(web), http_client=http(site.token))) as new:
            assert new.protocol_version == "2026-07-28"
            modern_tools = {tool.name: tool for tool in (await new.list_tools()).tools}
        return legacy_tools, modern_tools

    legacy_tools, modern_tools = asyncio.run(listed())
    assert {"send_invoice", "transfer_funds", "lookup_customer"} <= set(legacy_tools)
    assert set(modern_tools) == set(legacy_tools)
    assert legacy_tools["send_invoice"].input_schema["required"] == ["invoice_id", "amount"]
    assert legacy_tools["send_invoice"].execution is not None
    assert legacy_tools["send_invoice"].execution.task_support == "optional"


def test_a_call_that_does_not_pause_returns_its_output(site: Site) -> None:
    web = site.serve()

    async def call() -> types.CallToolResult:
        async with Client(streamable_http_client(mcp_url(web), http_client=http(site.token))) as client:
            return await client.call_tool("lookup_customer", {"customer_id": "cus_1"})

    result = asyncio.run(call())
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["status"] == "completed"
    assert result.structured_content["output"]["customer_id"] == "cus_1"


def test_a_paused_call_is_a_task_decided_in_the_inbox_and_outlives_a_restart(site: Site) -> None:
    web = site.serve()

    async def create() -> tuple[str, types.GetTaskResult]:
        async with legacy(web, site.token) as (session, dispatcher):
            created = await call_as_task(dispatcher, "send_invoice", INVOICE)
            assert created.task.status == "working"
            return created.task.task_id, await get_task(session, created.task.task_id)

    task_id, task = asyncio.run(create())
    assert task.status == "working"
    (run,) = runs(web, site)
    interrupt_id = pending_interrupt(web, site, run["id"])
    assert "Approve sending the invoice?" in (asyncio.run(_status_message(web, site.token, task_id)))

    # The server stops while the task waits; another starts, and a reviewer decides.
    stop(web.proc)
    web = site.serve()
    decide(web, interrupt_id, approve=True, fields={"answer-comment": "fine"})

    async def finished() -> tuple[types.GetTaskResult, types.CallToolResult]:
        async with legacy(web, site.token) as (session, _):
            result = await task_result(session, task_id)  # held until the task has ended
            return await get_task(session, task_id), result

    task, result = asyncio.run(finished())
    assert task.status == "completed"
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["output"]["invoice_id"] == "MCP-1"
    assert (
        result.meta is not None and result.meta["io.modelcontextprotocol/related-task"]["taskId"] == task_id
    )


async def _status_message(web: Server, token: str, task_id: str) -> str:
    async with legacy(web, token) as (session, _):
        return (await get_task(session, task_id)).status_message or ""


def test_tasks_result_is_held_until_the_reviewer_decides(site: Site) -> None:
    web = site.serve()

    async def scenario() -> types.CallToolResult:
        async with legacy(web, site.token) as (session, dispatcher):
            created = await call_as_task(dispatcher, "send_invoice", {"invoice_id": "MCP-2", "amount": 3})
            (run,) = await asyncio.to_thread(runs, web, site)
            interrupt_id = await asyncio.to_thread(pending_interrupt, web, site, run["id"])
            waiting = asyncio.ensure_future(task_result(session, created.task.task_id))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            await asyncio.to_thread(decide, web, interrupt_id, approve=False)
            return await asyncio.wait_for(waiting, 30)

    result = asyncio.run(scenario())
    assert result.is_error
    assert "not this week" in result.content[0].text  # type: ignore[union-attr]


def test_a_task_is_cancelled_and_leaves_the_inbox(site: Site) -> None:
    web = site.serve()

    async def scenario() -> tuple[types.CancelTaskResult, types.GetTaskResult]:
        async with legacy(web, site.token) as (session, dispatcher):
            created = await call_as_task(dispatcher, "send_invoice", {"invoice_id": "MCP-3", "amount": 3})
            (run,) = await asyncio.to_thread(runs, web, site)
            await asyncio.to_thread(pending_interrupt, web, site, run["id"])
            request = types.CancelTaskRequest(
                params=types.CancelTaskRequestParams(task_id=created.task.task_id)
            )
            cancelled = await session.send_request(request, types.CancelTaskResult)
            listed = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            assert [task.task_id for task in listed.tasks] == [created.task.task_id]
            return cancelled, await get_task(session, created.task.task_id)

    cancelled, task = asyncio.run(scenario())
    assert cancelled.status == "cancelled" and task.status == "cancelled"
    with api(web, site) as client:
        assert client.get("/api/interrupts", params={"status": "pending"}).json()["items"] == []


# 2026-07-28: the tasks extension, through the SDK's own extension hooks.


class Task(types.Result):
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class CreatedTask(Task):
    """What tools/call answers with a task (resultType "task")."""

    result_type: Literal["task"] = "task"


class DetailedTask(Task):
    """What tasks/get answers: the task, with its result once it has one."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskParams(types.RequestParams):
    task_id: str


class TasksGet(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class TasksExtension(ClientExtension):
    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(task: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
            got = await ended_task(ctx.session, task.task_id)
            if got.status == "completed" and got.result is not None:
                return types.CallToolResult.model_validate(got.result, by_name=False)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=got.status)], is_error=True
            )

        return [ResultClaim(result_type="task", model=CreatedTask, resolve=resolve)]


async def ended_task(session: ClientSession, task_id: str, seconds: float = 30) -> DetailedTask:
    """tasks/get, polled as a client does while the task is working (a decision queues the
    resumed step); bounded, so that a lost step fails the test rather than hangs it."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        got = await session.send_request(TasksGet(params=TaskParams(task_id=task_id)), DetailedTask)
        if got.status != "working" or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.1)


def test_a_2026_client_with_the_tasks_extension_gets_the_answer_through_the_task(site: Site) -> None:
    web = site.serve()

    async def scenario() -> tuple[CreatedTask, types.CallToolResult]:
        connection = streamable_http_client(mcp_url(web), http_client=http(site.token))
        async with Client(connection, extensions=[TasksExtension()]) as client:
            created = await client.session.call_tool("send_invoice", INVOICE, allow_claimed=True)
            assert isinstance(created, CreatedTask) and created.status == "working"

            async def reviewer() -> None:
                (run,) = await asyncio.to_thread(runs, web, site)  # pending_interrupt waits for its pause
                interrupt_id = await asyncio.to_thread(pending_interrupt, web, site, run["id"])
                await asyncio.to_thread(decide, web, interrupt_id, approve=True)

            deciding = asyncio.ensure_future(reviewer())
            await deciding
            got = await ended_task(client.session, created.task_id)
            assert got.status == "completed" and got.result is not None
            return created, types.CallToolResult.model_validate(got.result, by_name=False)

    _, result = asyncio.run(scenario())
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["output"]["invoice_id"] == "MCP-1"


def test_without_tasks_a_paused_call_says_it_is_pending_with_its_link(site: Site) -> None:
    site.env["GRUNDLAG_MCP_WAIT_SECONDS"] = "1"
    web = site.serve()

    async def call() -> types.CallToolResult:
        async with Client(streamable_http_client(mcp_url(web), http_client=http(site.token))) as client:
            return await client.call_tool("send_invoice", INVOICE)

    result = asyncio.run(call())
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["status"] == "pending"
    run_id = result.structured_content["run_id"]
    assert result.structured_content["url"].endswith(f"/runs/{run_id}/")
    assert f"Run {run_id} is pending" in result.content[0].text  # type: ignore[union-attr]


# Refused: bad calls start nothing; other teams see nothing; no token, no endpoint.


def test_bad_calls_are_refused_and_start_nothing(site: Site) -> None:
    web = site.serve()

    async def scenario() -> tuple[types.CallToolResult, MCPError, MCPError]:
        async with Client(streamable_http_client(mcp_url(web), http_client=http(site.token))) as client:
            invalid = await client.call_tool("send_invoice", {"invoice_id": "X", "amount": "lots"})
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("no_such_tool", {})
        async with legacy(web, site.token) as (_, dispatcher):
            with pytest.raises(MCPError) as as_task:
                await call_as_task(dispatcher, "send_invoice", {"amount": -1})
        return invalid, unknown.value, as_task.value

    invalid, unknown, as_task = asyncio.run(scenario())
    assert invalid.is_error and "amount" in invalid.content[0].text  # type: ignore[union-attr]
    assert "Unknown tool" in unknown.error.message
    assert "invoice_id" in as_task.error.message
    assert runs(web, site) == []


def test_another_teams_token_finds_no_task_and_no_token_is_refused(site: Site) -> None:
    web = site.serve()
    other = site.manage("create_api_token", "payroll", "--name", "mcp-other").strip().splitlines()[-1]

    async def scenario() -> MCPError:
        async with legacy(web, site.token) as (_, dispatcher):
            created = await call_as_task(dispatcher, "send_invoice", INVOICE)
        async with legacy(web, other) as (session, _):
            with pytest.raises(MCPError) as refused:
                await get_task(session, created.task.task_id)
            with pytest.raises(MCPError) as forged:
                await get_task(session, "1:forged")
            assert "not found" in forged.value.error.message
        return refused.value

    assert "not found" in asyncio.run(scenario()).error.message
    unauthenticated = httpx.post(
        mcp_url(web),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert unauthenticated.status_code == 401
    assert unauthenticated.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("setup", ["embedded", "scaled"])
def test_a_token_calls_the_teams_tools_only_with_the_mcp_scope(
    setup: str, request: pytest.FixtureRequest
) -> None:
    """On SQLite (`make run`'s server) and on PostgreSQL (a web process of the scaled setup): a
    token without the mcp scope is refused before anything runs, one with it alone lists and
    calls the team's tools through the official SDK."""
    site: Site = request.getfixturevalue("site" if setup == "embedded" else "scaled_site")
    web = site.serve() if setup == "embedded" else site.web()

    def token(*scopes: str) -> str:
        made = site.manage(
            "create_api_token", "demo", "--name", f"t-{'-'.join(scopes)}", "--scope", ",".join(scopes)
        )
        return made.strip().splitlines()[-1]

    refused = httpx.post(
        mcp_url(web),
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {token('runs:write')}",
        },
    )
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"
    assert 'scope="mcp"' in refused.headers["WWW-Authenticate"]

    async def tools() -> list[str]:
        async with legacy(web, token("mcp")) as (session, _):
            return [tool.name for tool in (await session.list_tools()).tools]

    assert "send_invoice" in asyncio.run(tools())


def test_in_the_scaled_setup_any_web_process_answers_for_a_task(scaled_site: Site) -> None:
    """PostgreSQL, Redis, a Celery worker and two daphne processes: a task made through one is
    answered by the other, and once the first is gone too."""
    site = scaled_site
    first, second = site.web(), site.web()
    site.worker("w1")

    async def create() -> str:
        async with legacy(first, site.token) as (_, dispatcher):
            created = await call_as_task(dispatcher, "send_invoice", {"invoice_id": "MCP-S", "amount": 9})
            return created.task.task_id

    task_id = asyncio.run(create())
    stop(first.proc)
    (run,) = runs(second, site)
    decide(second, pending_interrupt(second, site, run["id"]), approve=True)

    async def finished() -> tuple[types.GetTaskResult, types.CallToolResult]:
        async with legacy(second, site.token) as (session, _):
            result = await task_result(session, task_id)  # held until the task has ended
            return await get_task(session, task_id), result

    task, result = asyncio.run(finished())
    assert task.status == "completed"
    assert result.structured_content is not None
    assert result.structured_content["output"]["invoice_id"] == "MCP-S"


# The official TypeScript SDK's client (node, tests/node/mcp_task.mjs), as an agent host written
# in TypeScript calls the team's actions.

NODE_CLIENT = Path(__file__).parents[1] / "node" / "mcp_task.mjs"


def test_the_typescript_sdk_calls_a_tool_as_a_task_and_gets_its_result_once_approved(site: Site) -> None:
    web = site.serve()
    call = subprocess.Popen(
        ["node", str(NODE_CLIENT), mcp_url(web), site.token, "send_invoice", json.dumps(INVOICE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for each in call.stdout or ():
            lines.put(each)

    threading.Thread(target=read, daemon=True).start()

    def line() -> Any:
        """The client's next message, within a minute (a client stuck must fail the test)."""
        try:
            return json.loads(lines.get(timeout=60))
        except queue.Empty:
            raise AssertionError("the TypeScript client said nothing for 60 s") from None

    try:
        said = [line()]
        tools = {tool["name"]: tool for tool in said[0]["tools"]}
        assert tools["send_invoice"]["taskSupport"] == "optional"
        said.append(line())
        assert said[-1]["type"] == "taskCreated", said
        task_id = said[-1]["task"]["taskId"]
        (run,) = runs(web, site)
        decide(web, pending_interrupt(web, site, run["id"]), approve=True, fields={"answer-comment": "ts"})
        while said[-1]["type"] not in ("result", "error"):
            said.append(line())
        assert call.wait(timeout=60) == 0, call.stderr.read() if call.stderr else ""
    finally:
        call.kill()
    statuses = [m["task"]["status"] for m in said if m["type"] == "taskStatus"]
    assert set(statuses) <= {"working", "completed"}, statuses
    assert said[-1]["type"] == "result", said[-1]
    result = said[-1]["result"]
    assert not result.get("isError") and result["structuredContent"]["output"]["invoice_id"] == "MCP-1"
    assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == task_id
    (run,) = runs(web, site)
    assert run["status"] == "completed"
