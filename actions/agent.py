"""The agent consumer: a model-driven loop whose tool calls are actions that may pause.

An agent run is a `Run` of consumer ``agent``. Its conversation lives in ``run.driver_state``:
the messages (OpenAI chat format), the tools (registered actions), the model, and the results
of the current turn's tool calls. Each step continues the loop from what is stored:

1. If the last assistant turn has tool calls without results, resolve them: an approved pause
   re-runs that call's action with the answer; a rejected one becomes an error result that the
   model sees. Calls that already have a result are not run again.
2. Ask the model for the next turn. No tool calls: the run completes with its content. Tool
   calls: run each action; those that pause become pending interrupts (one per call, marked
   with its ``tool_call_id``) and the step ends; the run goes on when all are decided.
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol

from django.conf import settings

from actions import runner
from actions.core import (
    ActionResumption,
    Completed,
    Failed,
    Interrupted,
    Outcome,
    UnknownAction,
    invoke,
    registry,
)
from actions.models import Interrupt, Run

MAX_TURNS = 25
AGENT_ACTION = "agent"


class ModelError(Exception):
    pass


class ChatModel(Protocol):
    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        """Return the next assistant message, in the OpenAI chat format."""
        ...


class OpenAIChatModel:
    """Any OpenAI-compatible chat-completions server: a hosted API, vLLM, Ollama, llama.cpp."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout: float = 120) -> None:
        from openai import OpenAI

        # A server that wants no key still needs a non-empty one for the client.
        self.client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=2)
        self.model = model

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        from openai import OpenAIError

        try:
            response = self.client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                tools=tools or None,  # type: ignore[arg-type]
            )
        except OpenAIError as exc:
            raise ModelError(f"the model server refused or failed: {exc}") from exc
        if not response.choices:
            raise ModelError("the model returned no choices")
        message: dict[str, Any] = response.choices[0].message.model_dump(exclude_none=True)
        message.setdefault("content", None)
        return {key: value for key, value in message.items() if key in ("role", "content", "tool_calls")}


class ScriptedModel:
    """A deterministic model for demos and tests: turn N of the script answers the Nth call.

    A turn is ``{"content": "...", "tool_calls": [{"id": "...", "name": "...", "arguments": {...}}]}``.
    """

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.turns = turns

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        index = sum(1 for message in messages if message.get("role") == "assistant")
        if index >= len(self.turns):
            return {"role": "assistant", "content": "(the script has no more turns)"}
        turn = self.turns[index]
        message: dict[str, Any] = {"role": "assistant", "content": turn.get("content")}
        calls = turn.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {
                    "id": call.get("id") or f"call_{index}_{n}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
                }
                for n, call in enumerate(calls)
            ]
        return message


def resolve_model(spec: Any) -> ChatModel:
    """A model named in GRUNDLAG_MODELS, or ``{"scripted": [...turns...]}``."""
    if isinstance(spec, dict) and isinstance(spec.get("scripted"), list):
        return ScriptedModel(spec["scripted"])
    if isinstance(spec, str) and spec in settings.GRUNDLAG_MODELS:
        endpoint = settings.GRUNDLAG_MODELS[spec]
        # The key is read from the environment now; it is never stored or sent anywhere else.
        key = os.environ.get(endpoint.get("api_key_env", ""), "") if endpoint.get("api_key_env") else ""
        return OpenAIChatModel(endpoint["base_url"], endpoint["model"], key)
    raise ModelError(f"unknown model {spec!r}; configured: {sorted(settings.GRUNDLAG_MODELS)}")


def check_model(spec: Any) -> None:
    if isinstance(spec, dict):
        if not isinstance(spec.get("scripted"), list):
            raise ModelError('a model object must be {"scripted": [turns]}')
        return
    if spec not in settings.GRUNDLAG_MODELS:
        raise ModelError(f"unknown model {spec!r}; configured: {sorted(settings.GRUNDLAG_MODELS)}")


def tool_specs(names: list[str]) -> list[dict[str, Any]]:
    """The tools, as the model sees them: each action's name, description and input schema."""
    specs = []
    for name in names:
        act = registry.get(name)
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": act.name,
                    "description": act.description,
                    "parameters": act.input_schema(),
                },
            }
        )
    return specs


def start_agent(messages: list[dict[str, Any]], tools: list[str], model: Any, team: Any, by: Any) -> Run:
    """Validate and queue an agent run. Raises UnknownAction, ModelError, runner.InvalidInput."""
    for name in tools:
        registry.get(name)
    check_model(model)
    if not messages:
        raise runner.InvalidInput(
            "an agent needs at least one message", [{"loc": ["messages"], "msg": "empty"}]
        )
    state = {"messages": messages, "tools": tools, "model": model, "results": {}}
    payload = {"messages": messages, "tools": tools, "model": model if isinstance(model, str) else "scripted"}
    return runner.start_run(AGENT_ACTION, payload, team, by, Run.Consumer.AGENT, driver_state=state)


def _result_text(outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        return json.dumps(outcome.output, ensure_ascii=False)
    assert isinstance(outcome, Failed)
    return f"error: {outcome.error}"


def _pending_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant turn that have no tool message yet."""
    if not messages or messages[-1].get("role") != "assistant":
        return []
    return list(messages[-1].get("tool_calls") or [])


class AgentDriver(runner.Driver):
    rejection_continues = True  # a rejected tool call is an error result the model sees

    def step(self, run: Run) -> runner.StepResult:
        state = run.driver_state
        messages: list[dict[str, Any]] = state["messages"]
        results: dict[str, str] = state.setdefault("results", {})
        try:
            model = resolve_model(state["model"])
            tools = tool_specs(state["tools"])
        except (ModelError, UnknownAction) as exc:
            return runner.StepResult(Run.Status.FAILED, error=str(exc))

        pauses = self._run_calls(run, _pending_calls(messages), results)
        for _ in range(MAX_TURNS):
            if pauses:
                return runner.StepResult(Run.Status.INTERRUPTED, pauses=pauses)
            calls = _pending_calls(messages)
            for call in calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": results.pop(call["id"])}
                )
            try:
                reply = model.complete(messages, tools)
            except ModelError as exc:
                return runner.StepResult(Run.Status.FAILED, error=str(exc))
            reply["role"] = "assistant"
            messages.append(reply)
            if not reply.get("tool_calls"):
                return runner.StepResult(Run.Status.COMPLETED, output=reply.get("content") or "")
            pauses = self._run_calls(run, reply["tool_calls"], results)
        return runner.StepResult(Run.Status.FAILED, error=f"the agent took more than {MAX_TURNS} turns")

    def _run_calls(
        self, run: Run, calls: list[dict[str, Any]], results: dict[str, str]
    ) -> list[runner.Pause]:
        """Run every call that has no result yet; return the pauses of those that interrupt."""
        allowed = set(run.driver_state["tools"])
        pauses = []
        for call in calls:
            call_id = call["id"]
            if call_id in results:
                continue  # finished earlier in this turn: never run twice
            name = call.get("function", {}).get("name", "")
            last = run.interrupts.filter(tool_call_id=call_id).order_by("-seq").first()
            if last is not None and last.status == Interrupt.Status.REJECTED:
                results[call_id] = f"error: rejected by {last.decided_by_name}: {last.reason}"
                continue
            if name not in allowed:
                results[call_id] = f"error: there is no tool named {name!r}"
                continue
            try:
                arguments = json.loads(call["function"].get("arguments") or "{}")
            except json.JSONDecodeError:
                results[call_id] = "error: the arguments are not valid JSON"
                continue
            resumption = None
            if last is not None and last.status == Interrupt.Status.APPROVED:
                resumption = ActionResumption(data=last.answer, state=last.state)
            outcome = invoke(name, arguments, resumption, run_id=run.pk)
            if isinstance(outcome, Interrupted):
                pauses.append(
                    runner.Pause(
                        outcome.message, outcome.data, outcome.state, tool_call_id=call_id, action=name
                    )
                )
            else:
                results[call_id] = _result_text(outcome)
        return pauses


runner.DRIVERS[Run.Consumer.AGENT] = AgentDriver()
