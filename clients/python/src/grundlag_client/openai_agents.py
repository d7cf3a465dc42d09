"""The OpenAI Agents SDK's tool approvals, decided in a team's inbox: ``pip install
"grundlag-client[openai-agents]"``.

A tool with ``needs_approval`` stops ``Runner.run`` with ``result.interruptions``
(``ToolApprovalItem``). ``run_with_inbox(agent, input, client=...)`` asks the team about each
(the tool, its arguments, the agent's name), then ``state.approve(item)`` or
``state.reject(item, rejection_message=<the reason>)``, and runs on from the ``RunState`` until
the run ends; it returns the SDK's own run result. The SDK runs an approved call with the
arguments the model gave (it has no way to run it with others), so the form has no fields to
edit. The run state stays with the caller.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from grundlag_client import Client
from grundlag_client._calls import ToolDecision, ask_tool_call

try:
    from agents import Runner
except ImportError as exc:  # pragma: no cover - said once, plainly
    raise ImportError(
        "grundlag_client.openai_agents needs the OpenAI Agents SDK: "
        'pip install "grundlag-client[openai-agents]"'
    ) from exc

__all__ = ["ask", "arun_with_inbox", "run_with_inbox"]


def ask(
    item: Any, *, client: Client, timeout: float | None = None, deadline_seconds: int | None = None
) -> ToolDecision:
    """Ask the team about one ``ToolApprovalItem`` and wait for the decision."""
    try:
        arguments = json.loads(item.arguments or "{}")
    except ValueError:
        arguments = {"arguments": item.arguments}  # shown as the model sent it
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    agent = getattr(getattr(item, "agent", None), "name", "") or ""
    return ask_tool_call(
        client,
        getattr(item, "qualified_name", None) or item.tool_name or item.name or "tool",
        arguments,
        agent=agent,
        editable=False,
        timeout=timeout,
        deadline_seconds=deadline_seconds,
    )


def _decided(result: Any, client: Client, timeout: float | None, deadline_seconds: int | None) -> Any:
    """The run's state with each approval it stopped for decided in the inbox."""
    state = result.to_state()
    for item in result.interruptions:
        decision = ask(item, client=client, timeout=timeout, deadline_seconds=deadline_seconds)
        if decision.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=decision.reason)
    return state


def run_with_inbox(
    agent: Any,
    input: Any,
    *,
    client: Client,
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    **run: Any,
) -> Any:
    """``Runner.run_sync(agent, input, **run)``, every approval it stops for decided in the
    inbox, until the run ends; the SDK's run result."""
    result = Runner.run_sync(agent, input, **run)
    while result.interruptions:
        result = Runner.run_sync(agent, _decided(result, client, timeout, deadline_seconds), **run)
    return result


async def arun_with_inbox(
    agent: Any,
    input: Any,
    *,
    client: Client,
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    **run: Any,
) -> Any:
    """``run_with_inbox`` with ``Runner.run``; the waits run in a thread."""
    result = await Runner.run(agent, input, **run)
    while result.interruptions:
        state = await asyncio.to_thread(_decided, result, client, timeout, deadline_seconds)
        result = await Runner.run(agent, state, **run)
    return result
