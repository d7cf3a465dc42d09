"""PydanticAI's deferred tools, decided in a team's inbox: ``pip install
"grundlag-client[pydantic-ai]"``.

A tool registered with ``requires_approval=True`` stops the run with ``DeferredToolRequests``
(the agent's ``output_type`` includes it, as PydanticAI asks). ``decide(requests, client=...)``
asks the team about each call in ``requests.approvals`` (the tool, its arguments, the agent),
waits, and returns ``DeferredToolResults``: approved -> ``True``, or ``ToolApproved(
override_args=...)`` when the reviewer edited the arguments; rejected (or expired, cancelled)
-> ``ToolDenied(message=<the reason>)``, which the model reads as the tool's result.
``run_with_inbox(agent, prompt, client=...)`` runs the agent, deciding every stop this way,
until it ends; it returns PydanticAI's own run result. The messages stay with the caller.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from grundlag_client import Client
from grundlag_client._calls import ask_tool_call, key_part

try:
    from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
    from pydantic_ai.tools import ToolApproved
except ImportError as exc:  # pragma: no cover - said once, plainly
    raise ImportError(
        'grundlag_client.pydantic_ai needs PydanticAI: pip install "grundlag-client[pydantic-ai]"'
    ) from exc

__all__ = ["arun_with_inbox", "decide", "run_with_inbox"]


def decide(
    requests: DeferredToolRequests,
    *,
    client: Client,
    agent_name: str = "",
    key: str = "",
    timeout: float | None = None,
    deadline_seconds: int | None = None,
) -> DeferredToolResults:
    """Ask the team about each tool call waiting for approval, and wait for every decision.
    ``key``: an id of this run of yours (its calls' approvals are found again by it, should you
    ask again after a restart); ``timeout`` for each decision (then TimedOut, the approval left
    in the inbox)."""
    if requests.calls:
        raise ValueError(
            "these requests hold external calls (CallDeferred) too: the inbox decides approvals, "
            "your code runs those"
        )
    results = DeferredToolResults()
    validated = getattr(requests, "validated_args", None) or {}
    for call in requests.approvals:
        # What the tool would receive (validated, with its defaults), else what the model sent.
        arguments = validated.get(call.tool_call_id) or call.args_as_dict()
        # The call's id alone is not enough: a model may use one again for another call.
        called = json.dumps([call.tool_name, call.tool_call_id, arguments], sort_keys=True, default=str)
        decision = ask_tool_call(
            client,
            call.tool_name,
            arguments,
            agent=agent_name,
            key=f"pydantic-ai:{key_part(key)}:{key_part(called)}" if key else "",
            timeout=timeout,
            deadline_seconds=deadline_seconds,
        )
        if not decision.approved:
            results.approvals[call.tool_call_id] = ToolDenied(message=decision.reason)
        elif decision.edited:
            results.approvals[call.tool_call_id] = ToolApproved(override_args=decision.arguments)
        else:
            results.approvals[call.tool_call_id] = True
    return results


def run_with_inbox(
    agent: Any,
    prompt: Any,
    *,
    client: Client,
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    **run: Any,
) -> Any:
    """``agent.run_sync(prompt, **run)``, each stop for approvals decided in the inbox, until the
    run ends; PydanticAI's run result."""
    result = agent.run_sync(prompt, **run)
    run.pop("message_history", None)  # from here on, the run's own messages carry it
    while isinstance(result.output, DeferredToolRequests):
        decided = decide(
            result.output,
            client=client,
            agent_name=agent.name or "",
            timeout=timeout,
            deadline_seconds=deadline_seconds,
        )
        result = agent.run_sync(message_history=result.all_messages(), deferred_tool_results=decided, **run)
    return result


async def arun_with_inbox(
    agent: Any,
    prompt: Any,
    *,
    client: Client,
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    **run: Any,
) -> Any:
    """``run_with_inbox`` with ``agent.run``; the waits run in a thread."""
    result = await agent.run(prompt, **run)
    run.pop("message_history", None)  # from here on, the run's own messages carry it
    while isinstance(result.output, DeferredToolRequests):
        decided = await asyncio.to_thread(
            decide,
            result.output,
            client=client,
            agent_name=agent.name or "",
            timeout=timeout,
            deadline_seconds=deadline_seconds,
        )
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=decided, **run)
    return result
