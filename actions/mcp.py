"""The MCP endpoint: agent hosts call the team's actions as MCP tools, at /mcp/ over Streamable
HTTP, with the API's bearer token (the official ``mcp`` SDK's low-level server).

A tool call starts a run of the action (consumer ``mcp``) for the token's team. An action that
pauses waits in the team's inbox like any other; the call completes when a reviewer decides.

- Where the client takes tasks, the call returns a task at once: MCP's 2025-11-25 tasks
  (``tools/call`` with ``task``; ``tasks/get``, ``tasks/result``, ``tasks/cancel``,
  ``tasks/list``) and the 2026-07-28 tasks extension (``io.modelcontextprotocol/tasks``;
  ``tasks/get`` with the result inlined, ``tasks/cancel``). The task is the run: its id names
  the run (signed, so it cannot be guessed), and every answer about it is read from the
  database, so a task outlives the process that made it and is answered by any other.
- Otherwise the call waits for the run to finish, up to GRUNDLAG_MCP_WAIT_SECONDS, and then
  returns a result that says it is pending, with the link to it.
- A token's requests count against the API's rate of requests (GRUNDLAG_API_RATE: 429 with
  Retry-After, before the JSON-RPC is read), and its waits (a call's, tasks/result's) against
  its requests held at once (GRUNDLAG_MAX_WAITS_PER_TOKEN); tasks/result holds its answer
  GRUNDLAG_MCP_RESULT_HOLD_SECONDS at most.

Arguments are checked against the action's input schema before anything is started: a bad
call is an ``isError`` result naming the fields (so a model can correct it), and starts nothing.
The SDK keeps no state between requests here (stateless mode): any web process answers any.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast
from urllib.parse import urlparse

import mcp_types as types
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from channels.db import database_sync_to_async
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.core import signing
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
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
from actions.live import waiting
from actions.models import ApiToken, Interrupt, Run
from actions.reads import history

logger = logging.getLogger(__name__)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
LEGACY_TASKS = "2025-11-25"  # the protocol version whose core has tasks
POLL_INTERVAL_MS = 2000
TASKS_PAGE = 50

_signer = signing.Signer(salt="grundlag.mcp.task")
# The caller, for handlers run without an HTTP request (the SDK's in-process client).
_token: contextvars.ContextVar[ApiToken | None] = contextvars.ContextVar("grundlag_mcp_token", default=None)

R = TypeVar("R")
P = ParamSpec("P")


def _db(function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``function`` run in a thread off the event loop, with the database connection closed
    when stale before and after (channels' database_sync_to_async, typed)."""
    return cast(Callable[P, Awaitable[R]], database_sync_to_async(function))


def task_id(run: Run) -> str:
    return _signer.sign(str(run.pk))


def _run_id(task: str) -> int | None:
    try:
        value = _signer.unsign(task)
    except signing.BadSignature:
        return None
    return int(value) if value.isdigit() else None


def token_of(ctx: ServerRequestContext[Any, Any]) -> ApiToken:
    token = ctx.request.scope.get("grundlag.token") if ctx.request is not None else _token.get()
    if not isinstance(token, ApiToken):
        raise MCPError(code=INVALID_PARAMS, message="Not authenticated")
    return token


def modern(ctx: ServerRequestContext[Any, Any]) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def takes_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """2026-07-28: the request's client capabilities name the tasks extension."""
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)


def guarded(handler: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """An unexpected error is logged under an id and answered as an internal error naming it:
    its text (a path, a DSN) does not go to the client."""

    @functools.wraps(handler)
    async def guard(*args: Any, **kwargs: Any) -> R:
        try:
            return await handler(*args, **kwargs)
        except MCPError:
            raise
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            logger.exception("MCP %s failed (error id %s)", handler.__name__, error_id)
            raise MCPError(
                code=INTERNAL_ERROR,
                message=f"Internal error (error id {error_id}; details in the server log)",
            ) from None

    return guard


# What a run is, to an MCP client


def run_url(run: Run) -> str:
    return settings.GRUNDLAG_BASE_URL.rstrip("/") + run.get_absolute_url()


def text_result(text: str, structured: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured, is_error=error
    )


def finished_result(run: Run) -> types.CallToolResult:
    """The tool's result once the run has finished: its output, or why it has none (a
    rejection, a failure, a cancel: isError, for the model to see)."""
    about = {"run_id": run.pk, "status": run.status, "url": run_url(run)}
    if run.status == Run.Status.COMPLETED:
        return text_result(json.dumps(run.output), {**about, "output": run.output})
    what = {
        Run.Status.REJECTED: f"Rejected by the reviewer: {run.error}",
        Run.Status.CANCELLED: f"Cancelled: {run.error}" if run.error else "Cancelled.",
    }.get(Run.Status(run.status), f"Failed: {run.error}")
    return text_result(what, {**about, "error": run.error}, error=True)


def pending_text(run: Run, waiting_on: Interrupt | None) -> str:
    why = f' ("{waiting_on.message}")' if waiting_on is not None else ""
    return f"Waiting for a person's approval{why}. Run {run.pk} is pending; follow it at {run_url(run)}"


def api_url(run: Run) -> str:
    """Where a program reads the run with the same token (``Prefer: wait`` holds it)."""
    return f"{settings.GRUNDLAG_BASE_URL.rstrip('/')}/api/runs/{run.pk}"


def pending_result(run: Run, waiting_on: Interrupt | None) -> types.CallToolResult:
    about = {"run_id": run.pk, "status": "pending", "url": run_url(run), "api_url": api_url(run)}
    return text_result(pending_text(run, waiting_on), about)


def _task(run: Run, waiting_on: Interrupt | None, *, ttl: str, poll: str) -> dict[str, Any]:
    status = {
        Run.Status.COMPLETED: "completed",
        Run.Status.CANCELLED: "cancelled",
        Run.Status.FAILED: "failed",
        Run.Status.REJECTED: "failed",
    }.get(Run.Status(run.status), "working")
    message = {
        "working": pending_text(run, waiting_on) if run.status == Run.Status.INTERRUPTED else "Running.",
        "failed": f"{run.status}: {run.error}",
        "completed": "Completed.",
        "cancelled": "Cancelled.",
    }[status]
    task: dict[str, Any] = {
        "taskId": task_id(run),
        "status": status,
        "statusMessage": message,
        "createdAt": run.created_at.isoformat(),
        "lastUpdatedAt": run.updated_at.isoformat(),
        ttl: None,  # kept as long as the run is: a required key, and null says unlimited
    }
    if status == "working":
        task[poll] = POLL_INTERVAL_MS
    return task


def legacy_task(run: Run, waiting_on: Interrupt | None = None) -> dict[str, Any]:
    return _task(run, waiting_on, ttl="ttl", poll="pollInterval")


def modern_task(run: Run, waiting_on: Interrupt | None = None) -> dict[str, Any]:
    """The tasks extension's task: a tool that ran and reported a problem is ``completed`` with
    an isError result (``failed`` is for protocol errors), the result inlined."""
    task = _task(run, waiting_on, ttl="ttlMs", poll="pollIntervalMs")
    if run.is_finished and run.status != Run.Status.CANCELLED:
        task["status"] = "completed"
        task["result"] = finished_result(run).model_dump(by_alias=True, mode="json", exclude_none=True)
    return task


# The database, from the event loop


@_db
def _start(token: ApiToken, name: str, arguments: dict[str, Any]) -> Run | types.CallToolResult:
    """Start the tool's run; a call that cannot start is the model's to correct: isError."""
    try:
        return engine.start_run(name, arguments, token.team, token, Run.Consumer.MCP)
    except engine.InvalidInput as exc:
        errors = describe_errors(exc.errors)
        return text_result(f"Invalid arguments: {errors}", {"errors": exc.errors}, error=True)
    except engine.PayloadTooLarge as exc:
        return text_result(f"Invalid arguments: {exc}", {"errors": [str(exc)]}, error=True)


@_db
def _waiting_on(run: Run) -> Interrupt | None:
    if run.status != Run.Status.INTERRUPTED:
        return None
    return run.interrupts.filter(status=Interrupt.Status.PENDING).defer("state").order_by("seq").first()


@_db
def _owned(token: ApiToken, task: str) -> Run | None:
    run_id = _run_id(task)
    if run_id is None:
        return None
    return Run.objects.filter(pk=run_id, team=token.team_id, consumer=Run.Consumer.MCP).first()


@_db
def _cancel(run: Run, token: ApiToken) -> Run:
    try:
        engine.cancel(run, token)
    except (engine.NotCancellable, engine.NotAllowed) as exc:
        raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
    run.refresh_from_db()
    return run


@_db
def _tasks_page(token: ApiToken, cursor: str) -> tuple[list[Run], str]:
    runs = Run.objects.filter(team=token.team_id, consumer=Run.Consumer.MCP).defer("input", "driver_state")
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
    tools = []
    for act in registry.all():
        tool = types.Tool(name=act.name, description=act.description, input_schema=act.input_schema())
        if ctx.protocol_version == LEGACY_TASKS:
            # Any action may pause: a client may ask for a task, or wait for the result.
            tool.execution = types.ToolExecution(task_support="optional")
        tools.append(tool)
    return types.ListToolsResult(tools=tools)


def _tool(params: types.CallToolRequestParams) -> str:
    if registry.find(params.name) is None:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")
    return params.name


@guarded
async def call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    """A call without a task: wait for the run to finish, up to GRUNDLAG_MCP_WAIT_SECONDS."""
    token = token_of(ctx)
    started = await _start(token, _tool(params), params.arguments or {})
    if isinstance(started, types.CallToolResult):
        return started
    run, _ = await _wait(token, started, settings.GRUNDLAG_MCP_WAIT_SECONDS)
    if run.is_finished:
        return finished_result(run)
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
        started = await _start(token, _tool(params), params.arguments or {})
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
    run = await _owned(token, task)
    if run is None:  # no such task, or another team's: the same answer
        raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
    return token, run


@guarded
async def tasks_get(
    ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
) -> dict[str, Any]:
    _, run = await _task_run(ctx, params.task_id)
    waiting_on = await _waiting_on(run)
    return modern_task(run, waiting_on) if modern(ctx) else legacy_task(run, waiting_on)


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
    result = finished_result(run).model_dump(by_alias=True, mode="json", exclude_none=True)
    result["_meta"] = {RELATED_TASK: {"taskId": params.task_id}}
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
    runs, cursor = await _tasks_page(token_of(ctx), (params.cursor if params else None) or "")
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
            "Your team's actions. A call may wait for a person's approval: as a task where your "
            "client takes tasks; otherwise it says it is pending, with a link to follow."
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


# ASGI


async def _respond(send: Any, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def origin_allowed(origin: bytes) -> bool:
    """Whether a page of this origin (an ``Origin`` header) may call: one of
    GRUNDLAG_ALLOWED_ORIGINS, matched by channels' OriginValidator as the websocket's are."""
    try:
        parsed = urlparse(origin.decode("latin-1"))
        return bool(OriginValidator(None, settings.GRUNDLAG_ALLOWED_ORIGINS).validate_origin(parsed))
    except ValueError:  # not a URL, or a port that is not a number
        return False


def _retry_after(token: ApiToken) -> int | None:
    """None while the token is within its rate of requests (the API's, GRUNDLAG_API_RATE: one
    budget for /api/ and /mcp/); else the seconds before it may ask again (Retry-After)."""
    request = HttpRequest()
    request.auth = token  # type: ignore[attr-defined]  # where ninja's authentication puts it
    return waiting.TokenRateThrottle().retry_after(request)


class Endpoint:
    """The ASGI app at /mcp/: the site's allowed hosts and origins, the API's bearer token, then
    the SDK's Streamable HTTP transport (stateless). An ``Origin`` header says a browser sent
    the request: from a page not allowed, it is refused (403) before anything else, as the
    transport's spec asks against DNS rebinding; MCP clients that are programs send none.
    Daphne sends no lifespan events: the SDK's session manager is started by the first
    request, in a task of its own that lives with the process."""

    def __init__(self, server: Server[Any]) -> None:
        self.server = server
        self._manager: StreamableHTTPSessionManager | None = None
        self._starting: asyncio.Lock | None = None
        self._runner: asyncio.Task[None] | None = None

    async def manager(self) -> StreamableHTTPSessionManager:
        if self._manager is not None:
            return self._manager
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._manager is None:
                manager = StreamableHTTPSessionManager(
                    app=self.server,
                    stateless=True,
                    json_response=False,
                    # The site's one cap (BodyLimit refuses a bigger body before this sees it),
                    # not the SDK's own 4 MiB.
                    max_request_body_size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
                )
                ready = asyncio.Event()

                async def run() -> None:
                    async with manager.run():
                        ready.set()
                        await asyncio.Event().wait()  # as long as the process

                # A context of its own: not the first request's.
                self._runner = asyncio.get_running_loop().create_task(run(), context=contextvars.Context())
                waiter = asyncio.ensure_future(ready.wait())
                await asyncio.wait({self._runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if not ready.is_set():
                    waiter.cancel()
                    self._runner.result()  # why it did not start
                self._manager = manager
        return self._manager

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        host, _ = split_domain_port(headers.get(b"host", b"").decode("latin-1"))
        if not validate_host(host, settings.ALLOWED_HOSTS):
            await _respond(send, 400, {"error": "bad_request", "error_description": "Host not allowed"}, [])
            return
        origin = headers.get(b"origin")
        if origin is not None and not origin_allowed(origin):
            await _respond(send, 403, {"error": "forbidden", "error_description": "Origin not allowed"}, [])
            return
        token = await _db(ApiToken.from_authorization)(headers.get(b"authorization", b"").decode("latin-1"))
        if token is None:
            body = {"error": "invalid_token", "error_description": "An API token is required (Bearer)"}
            await _respond(send, 401, body, [(b"www-authenticate", b'Bearer error="invalid_token"')])
            return
        if scope["method"] == "GET":
            # Stateless: there is no stream for the server's own messages to offer.
            await _respond(send, 405, {"error": "method_not_allowed"}, [(b"allow", b"POST")])
            return
        if (retry_after := await sync_to_async(_retry_after, thread_sensitive=False)(token)) is not None:
            body = {"error": "rate_limited", "error_description": "Too many requests for this token"}
            await _respond(send, 429, body, [(b"retry-after", str(retry_after).encode())])
            return
        manager = await self.manager()
        reset = _token.set(token)
        try:
            # As Django does for each request: the request's database work in a thread of its
            # own, not queued behind every other MCP call and websocket of the process.
            async with ThreadSensitiveContext():
                await manager.handle_request({**scope, "grundlag.token": token}, receive, send)
        finally:
            _token.reset(reset)


endpoint = Endpoint(build_server())


def mount(app: Any, path: str = "/mcp") -> Any:
    """``app`` with /mcp and /mcp/ answered by the MCP endpoint (neither redirects: an MCP
    client follows no redirect of a POST)."""

    async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == path:
            await endpoint(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route
