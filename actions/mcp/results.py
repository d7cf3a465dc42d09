"""What the MCP endpoint's parts share: the protocol's names, the caller's token, a task's id
(the run's, signed), and what a run is to an MCP client (a result, a task)."""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

import mcp_types as types
from channels.db import database_sync_to_async
from django.conf import settings
from django.core import signing
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from actions.models import ApiToken, Interrupt, McpUpstream, Run

logger = logging.getLogger(__name__)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
LEGACY_TASKS = "2025-11-25"  # the protocol version whose core has tasks
POLL_INTERVAL_MS = 2000
TASKS_PAGE = 50

_signer = signing.Signer(salt="grundlag.mcp.task")
# The caller, for handlers run without an HTTP request (the SDK's in-process client).
caller_token: contextvars.ContextVar[ApiToken | None] = contextvars.ContextVar(
    "grundlag_mcp_token", default=None
)

R = TypeVar("R")
P = ParamSpec("P")


def off_the_loop(function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """``function`` run in a thread off the event loop, with the database connection closed
    when stale before and after (channels' database_sync_to_async, typed)."""
    return cast(Callable[P, Awaitable[R]], database_sync_to_async(function))


def task_id(run: Run) -> str:
    return _signer.sign(str(run.pk))


def run_id_of(task: str) -> int | None:
    try:
        value = _signer.unsign(task)
    except signing.BadSignature:
        return None
    return int(value) if value.isdigit() else None


def token_of(ctx: ServerRequestContext[Any, Any]) -> ApiToken:
    token = ctx.request.scope.get("grundlag.token") if ctx.request is not None else caller_token.get()
    if not isinstance(token, ApiToken):
        raise MCPError(code=INVALID_PARAMS, message="Not authenticated")
    return token


def upstream_of(ctx: ServerRequestContext[Any, Any]) -> McpUpstream | None:
    """The upstream MCP server the request is for, at /mcp/gateway/<name>/; None at /mcp/."""
    upstream = ctx.request.scope.get("grundlag.upstream") if ctx.request is not None else None
    return upstream if isinstance(upstream, McpUpstream) else None


def consumer_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """The runs this endpoint's tasks are: the team's actions' (/mcp/), or its gateway's."""
    return Run.Consumer.GATEWAY if upstream_of(ctx) is not None else Run.Consumer.MCP


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
    if run.status == Run.Status.COMPLETED and run.consumer == Run.Consumer.GATEWAY:
        # The upstream's own result, as it gave it (its isError too).
        return types.CallToolResult.model_validate(run.output, by_name=False)
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
    if run.consumer == Run.Consumer.GATEWAY:
        # An upstream's tool may declare an outputSchema, which clients check a result's
        # structured content against (and insist on): "pending" is not its output. As an error,
        # it is checked against nothing, and the model reads that the call has not run yet.
        text = (
            f"{pending_text(run, waiting_on)}. It has not run yet: call it again with the same"
            " arguments for its result."
        )
        return text_result(text, about, error=True)
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
