"""Agents and scripts: runs of a model's loop and of a sandboxed script."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router, Status

from actions.api.base import (
    AgentRunDetailOut,
    AgentRunIn,
    Error,
    RunOut,
    ScriptRunDetailOut,
    ScriptRunIn,
    needs,
    token_of,
)
from actions.api.responses import get_run, run_out, started
from actions.drivers.agent import start_agent
from actions.drivers.sandbox import start_script
from actions.models import Run, Scope

router = Router()


# Agents


def agent_out(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {**run_out(request, run, transcript=True), "messages": run.driver_state.get("messages", [])}


@router.post(
    "/agents/runs",
    response={200: RunOut, 202: RunOut, 404: Error, 413: Error, 422: Error},
    tags=["agents"],
    auth=needs(Scope.RUNS_WRITE),
)
async def create_agent_run(
    request: HttpRequest, response: HttpResponse, payload: AgentRunIn
) -> Status[dict[str, Any]]:
    """Start an agent: the model loops over its tool calls; a call that pauses stops the run as
    `interrupted` with the interrupt (and its `tool_call_id`); answer it like any interrupt."""
    messages = [message.model_dump(exclude_none=True) for message in payload.messages]
    return await started(
        request,
        response,
        lambda token: start_agent(messages, payload.tools, payload.model, token.team, token),
    )


@router.get(
    "/agents/runs/{run_id}",
    response={200: AgentRunDetailOut, 404: Error},
    tags=["agents"],
    auth=needs(Scope.RUNS_WRITE),
)
def read_agent_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The agent run with its transcript and its conversation (`messages`)."""
    return agent_out(request, get_run(token_of(request), run_id, consumer=Run.Consumer.AGENT))


# Scripts


@router.post(
    "/scripts/runs",
    response={200: RunOut, 202: RunOut, 413: Error, 422: Error, 503: Error},
    tags=["scripts"],
    auth=needs(Scope.RUNS_WRITE),
)
async def create_script_run(
    request: HttpRequest, response: HttpResponse, payload: ScriptRunIn
) -> Status[dict[str, Any]]:
    """Run a script in the sandbox. It reads `input`, calls `tools.<action>(**kwargs)`, and its
    `return` value is the output. A call that pauses stops it as `interrupted`; answering the
    interrupt replays the script from its call log."""
    return await started(
        request, response, lambda token: start_script(payload.source, payload.input, token.team, token)
    )


@router.get(
    "/scripts/runs/{run_id}",
    response={200: ScriptRunDetailOut, 404: Error},
    tags=["scripts"],
    auth=needs(Scope.RUNS_WRITE),
)
def read_script_run(request: HttpRequest, run_id: int) -> dict[str, Any]:
    """The script run with its transcript and its call log."""
    run = get_run(token_of(request), run_id, consumer=Run.Consumer.SANDBOX)
    paused = run.driver_state.get("paused")
    return {
        **run_out(request, run, transcript=True),
        "call_log": run.driver_state.get("call_log", []),
        "paused_at": paused["position"] if paused else None,
    }
