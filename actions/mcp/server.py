"""The MCP server: tools/list and tools/call over the team's actions (/mcp/) or over the tools of
one of its upstream MCP servers (/mcp/gateway/<name>/, actions.drivers.gateway), and the tasks of
both protocol revisions, each answered from the database."""

from __future__ import annotations

import logging
from typing import Any

import mcp_types as types
from django.conf import settings
from django.utils import timezone
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    REQUEST_TIMEOUT,
    SERVER_INFO_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from actions import engine
from actions.core import describe_errors, registry
from actions.drivers import gateway as gateway_driver
from actions.live import waiting
from actions.mcp.results import (
    IMMEDIATE_RESPONSE,
    LEGACY_TASKS,
    RELATED_TASK,
    TASKS_EXTENSION,
    TASKS_PAGE,
    finished_result,
    guarded,
    legacy_task,
    modern,
    modern_task,
    off_the_loop,
    pending_result,
    run_id_of,
    run_url,
    takes_tasks,
    text_result,
    token_of,
    upstream_of,
)
from actions.models import ApiToken, Interrupt, McpUpstream, Run
from actions.reads import history

logger = logging.getLogger(__name__)

# The database, from the event loop


@off_the_loop
def _start(
    token: ApiToken, name: str, arguments: dict[str, Any], upstream: McpUpstream | None = None
) -> Run | types.CallToolResult:
    """Start the tool's run (through the gateway: join the same call's, when the host sends it
    again before it has its result); a call that cannot start is the model's to correct:
    isError."""
    try:
        if upstream is not None:
            return engine.gateway.start_call(token, upstream, name, arguments)[0]
        return engine.start_run(name, arguments, token.team, token, Run.Consumer.MCP)
    except engine.InvalidInput as exc:
        errors = describe_errors(exc.errors)
        return text_result(f"Invalid arguments: {errors}", {"errors": exc.errors}, error=True)
    except engine.PayloadTooLarge as exc:
        return text_result(f"Invalid arguments: {exc}", {"errors": [str(exc)]}, error=True)


@off_the_loop
def _waiting_on(run: Run) -> Interrupt | None:
    if run.status != Run.Status.INTERRUPTED:
        return None
    return run.interrupts.filter(status=Interrupt.Status.PENDING).defer("state").order_by("seq").first()


@off_the_loop
def _owned(token: ApiToken, task: str, upstream: McpUpstream | None) -> Run | None:
    run_id = run_id_of(task)
    if run_id is None:
        return None
    runs = Run.objects.filter(pk=run_id, team=token.team_id)
    if upstream is None:
        return runs.filter(consumer=Run.Consumer.MCP).first()
    return runs.filter(consumer=Run.Consumer.GATEWAY, gateway_call__upstream=upstream).first()


@off_the_loop
def _delivered(run: Run, token: ApiToken) -> None:
    """A gateway call's final result is on its way to the host that made it: the same call
    sent again after this is a new one (before it, a retry, which joins this)."""
    if run.consumer == Run.Consumer.GATEWAY and run.is_finished:
        engine.gateway.delivered(run.pk, token)


async def _finished(run: Run, token: ApiToken) -> types.CallToolResult:
    await _delivered(run, token)
    return finished_result(run)


@off_the_loop
def _upstream_tools(upstream: McpUpstream) -> list[dict[str, Any]]:
    """The upstream's tools: as it last listed them, asked again when that is older than
    GRUNDLAG_GATEWAY_TOOLS_SECONDS (or it said its list changed). An upstream that cannot be
    asked is served from what it last said, if it ever said anything."""
    upstream.refresh_from_db(fields=["tools", "tools_fetched_at", "tools_error"])
    age = (timezone.now() - upstream.tools_fetched_at).total_seconds() if upstream.tools_fetched_at else None
    if age is not None and age < settings.GRUNDLAG_GATEWAY_TOOLS_SECONDS:
        return list(upstream.tools)
    try:
        return gateway_driver.refresh_tools(upstream)
    except gateway_driver.UpstreamFailed as exc:
        if not upstream.tools:
            raise MCPError(
                code=INTERNAL_ERROR,
                message=f"The upstream MCP server {upstream.name} could not be asked: {exc}",
            ) from None
        return list(upstream.tools)


@off_the_loop
def _cancel(run: Run, token: ApiToken) -> Run:
    try:
        engine.cancel(run, token)
    except (engine.NotCancellable, engine.NotAllowed) as exc:
        raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
    run.refresh_from_db()
    return run


@off_the_loop
def _tasks_page(token: ApiToken, cursor: str, upstream: McpUpstream | None) -> tuple[list[Run], str]:
    runs = Run.objects.filter(team=token.team_id).defer("input", "driver_state")
    if upstream is None:
        runs = runs.filter(consumer=Run.Consumer.MCP)
    else:
        runs = runs.filter(consumer=Run.Consumer.GATEWAY, gateway_call__upstream=upstream)
    return history.page(runs, cursor, TASKS_PAGE)


async def _wait(token: ApiToken, run: Run, seconds: float) -> tuple[Run, bool]:
    """The run once it has finished, or after ``seconds``; and whether it was waited for: not
    when the token has as many requests held as it may (GRUNDLAG_MAX_WAITS_PER_TOKEN, the
    API's `Prefer: wait` among them), read at once then."""
    with waiting.place_to_wait(token.pk) as placed:
        return await waiting.wait_for(run.pk, seconds if placed else 0, Run.FINISHED), placed


# Handlers


@guarded
async def list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    token_of(ctx)
    if (upstream := upstream_of(ctx)) is not None:
        tools = [types.Tool.model_validate(tool, by_name=False) for tool in await _upstream_tools(upstream)]
    else:
        tools = [
            types.Tool(name=act.name, description=act.description, input_schema=act.input_schema())
            for act in registry.all()
        ]
    for tool in tools:
        if ctx.protocol_version == LEGACY_TASKS:
            # Any call may pause: a client may ask for a task, or wait for the result.
            tool.execution = types.ToolExecution(task_support="optional")
    return types.ListToolsResult(tools=tools)


async def _tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> str:
    if (upstream := upstream_of(ctx)) is not None:
        known = any(tool.get("name") == params.name for tool in await _upstream_tools(upstream))
    else:
        known = registry.find(params.name) is not None
    if not known:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")
    return params.name


@guarded
async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    """A call without a task: wait for the run to finish, up to GRUNDLAG_MCP_WAIT_SECONDS."""
    token = token_of(ctx)
    started = await _start(token, await _tool(ctx, params), params.arguments or {}, upstream_of(ctx))
    if isinstance(started, types.CallToolResult):
        return started
    run, _ = await _wait(token, started, settings.GRUNDLAG_MCP_WAIT_SECONDS)
    if run.is_finished:
        return await _finished(run, token)
    return pending_result(run, await _waiting_on(run))


class TasksMiddleware:
    """Turns a ``tools/call`` that asks for a task into one, answered at once. (A middleware, not
    the call handler: the SDK checks a handler's 2025-11-25 ``tools/call`` answer against the
    plain tool result's shape.)"""

    def __init__(self, server: Server[Any]) -> None:
        self.server = server

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        raw = ctx.params or {}
        if modern(ctx):
            wants = takes_tasks(ctx)  # the server decides, for a client that takes them
        else:
            wants = ctx.protocol_version == LEGACY_TASKS and isinstance(raw.get("task"), dict)
        if not wants:
            return await call_next(ctx)
        return await self.as_task(ctx, types.CallToolRequestParams.model_validate(raw, by_name=False))

    @guarded
    async def as_task(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> HandlerResult:
        token = token_of(ctx)
        started = await _start(token, await _tool(ctx, params), params.arguments or {}, upstream_of(ctx))
        if isinstance(started, types.CallToolResult):
            if modern(ctx):
                return started.model_dump(by_alias=True, mode="json", exclude_none=True)
            # 2025-11-25: the client asked for a task and there is none: a protocol error.
            raise MCPError(code=INVALID_PARAMS, message=started.content[0].text)  # type: ignore[union-attr]
        # Committed by now: any process asked about the task next finds it.
        if modern(ctx):
            return {
                "resultType": "task",
                **modern_task(started),
                "_meta": {SERVER_INFO_META_KEY: self.server.server_info_stamp},
            }
        text = f"Started run {started.pk}; it may wait for a person's approval: {run_url(started)}"
        return {"task": legacy_task(started), "_meta": {IMMEDIATE_RESPONSE: text}}


async def _task_run(ctx: ServerRequestContext[Any, Any], task: str) -> tuple[ApiToken, Run]:
    if modern(ctx) and not takes_tasks(ctx):
        raise MCPError(
            code=MISSING_REQUIRED_CLIENT_CAPABILITY,
            message="Missing required client capability",
            data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
        )
    token = token_of(ctx)
    run = await _owned(token, task, upstream_of(ctx))
    if run is None:  # no such task, or another team's: the same answer
        raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
    return token, run


@guarded
async def tasks_get(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
) -> dict[str, Any]:
    token, run = await _task_run(ctx, params.task_id)
    waiting_on = await _waiting_on(run)
    if modern(ctx):
        await _delivered(run, token)  # the extension's task carries its result
        return modern_task(run, waiting_on)
    return legacy_task(run, waiting_on)


@guarded
async def tasks_result(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
) -> dict[str, Any]:
    """2025-11-25: the tool's result, once the run has finished: held until then, but for
    GRUNDLAG_MCP_RESULT_HOLD_SECONDS at most (not at all past the token's waiting requests).

    The spec holds tasks/result until the task ends, and a person may take days to decide: the
    stream's keep-alives would keep the client's read timeout from ever ending the hold. So a
    task still working then is answered with an error (REQUEST_TIMEOUT, as the SDK's own timeout
    is) whose data is the task as it is now, as tasks/get tells it: the client asks tasks/result
    again, or polls tasks/get, as it would after a timeout of its own."""
    if modern(ctx):
        raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data="tasks/result")
    token, run = await _task_run(ctx, params.task_id)
    run, waited = await _wait(token, run, settings.GRUNDLAG_MCP_RESULT_HOLD_SECONDS)
    if not run.is_finished:
        why = (
            f"held {settings.GRUNDLAG_MCP_RESULT_HOLD_SECONDS:g} s"
            if waited
            else "not held: this token has as many requests waiting as it may"
        )
        raise MCPError(
            code=REQUEST_TIMEOUT,
            message=f"Task still working ({why}): call tasks/result again, or poll tasks/get",
            data={"task": legacy_task(run, await _waiting_on(run))},
        )
    result = (await _finished(run, token)).model_dump(by_alias=True, mode="json", exclude_none=True)
    result["_meta"] = {**result.get("_meta", {}), RELATED_TASK: {"taskId": params.task_id}}
    return result


@guarded
async def tasks_cancel(
    ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
) -> dict[str, Any]:
    """Cancel the run: its pending approvals leave the inbox."""
    token, run = await _task_run(ctx, params.task_id)
    if run.is_finished:
        if modern(ctx):
            return {}
        raise MCPError(code=INVALID_PARAMS, message=f"Task is already {legacy_task(run)['status']}")
    run = await _cancel(run, token)
    return {} if modern(ctx) else legacy_task(run)


@guarded
async def tasks_list(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> dict[str, Any]:
    """2025-11-25: the team's tasks (its runs started through MCP), newest first."""
    if modern(ctx):
        raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data="tasks/list")
    runs, cursor = await _tasks_page(
        token_of(ctx), (params.cursor if params else None) or "", upstream_of(ctx)
    )
    listed: dict[str, Any] = {"tasks": [legacy_task(run) for run in runs]}
    if cursor:
        listed["nextCursor"] = cursor
    return listed


class UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


@guarded
async def tasks_update(ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
    """2026-07-28: a run asks people, not the client, for input: there is nothing to update."""
    if not modern(ctx):
        raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data="tasks/update")
    await _task_run(ctx, params.task_id)
    return {}


class GrundlagServer(Server[Any]):
    def get_capabilities(self, *args: Any, protocol_version: str | None = None, **kwargs: Any) -> Any:
        capabilities = super().get_capabilities(*args, protocol_version=protocol_version, **kwargs)
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            return capabilities  # the tasks extension, from self.extensions
        return capabilities.model_copy(
            update={
                "tasks": types.ServerTasksCapability(
                    list=types.TasksListCapability(),
                    cancel=types.TasksCancelCapability(),
                    requests=types.ServerTasksRequestsCapability(
                        tools=types.TasksToolsCapability(call=types.TasksCallCapability())
                    ),
                ),
                "extensions": None,
            }
        )


def build_server() -> GrundlagServer:
    server = GrundlagServer(
        "grundlag-approvals",
        version="1.0",
        instructions=(
            "Your team's tools (its actions, or an MCP server's through its gateway). A call may "
            "wait for a person's approval: as a task where your client takes tasks; otherwise "
            "it says it is pending, with a link to follow."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # No tool declares headers to check: nothing for the SDK to list the tools again for.
        get_tool_input_schema=lambda name: None,
    )
    server.extensions[TASKS_EXTENSION] = {}
    server.middleware.append(TasksMiddleware(server))
    server.add_request_handler("tasks/get", types.GetTaskRequestParams, tasks_get)
    server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, tasks_result)
    server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, tasks_cancel)
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, tasks_list)
    server.add_request_handler("tasks/update", UpdateTaskParams, tasks_update)
    return server
