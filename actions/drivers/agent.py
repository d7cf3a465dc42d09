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

from actions import engine
from actions.core import (
    Completed,
    Failed,
    Interrupted,
    Outcome,
    UnknownAction,
    invoke,
    registry,
)
from actions.engine.driving import Answers, Driver, Pause, StepResult, call_binding
from actions.models import Run

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
        from openai import OpenAI  # noqa: PLC0415 (the client library loads only where an agent runs)

        # A server that wants no key still needs a non-empty one for the client.
        self.client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=2)
        self.model = model

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        from openai import OpenAIError  # noqa: PLC0415 (the client library loads only where an agent runs)

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
    """Validate and queue an agent run. Raises UnknownAction, ModelError, engine.InvalidInput."""
    for name in tools:
        registry.get(name)
    check_model(model)
    if not messages:
        raise engine.InvalidInput(
            "an agent needs at least one message", [{"loc": ["messages"], "msg": "empty"}]
        )
    state = {"messages": messages, "tools": tools, "model": model, "results": {}}
    payload = {"messages": messages, "tools": tools, "model": model if isinstance(model, str) else "scripted"}
    return engine.start_run(AGENT_ACTION, payload, team, by, Run.Consumer.AGENT, driver_state=state)


def _result_text(run_id: int, outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        return json.dumps(outcome.output, ensure_ascii=False)
    assert isinstance(outcome, Failed)
    return f"error: {engine.public_error(run_id, outcome)}"


def _pending_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant turn that have no tool message yet."""
    if not messages or messages[-1].get("role") != "assistant":
        return []
    return list(messages[-1].get("tool_calls") or [])


def _turn(messages: list[dict[str, Any]]) -> int:
    """The number of the last assistant turn (0 for the first): with a call's position, it
    says which call an approval was given for, whatever ids the model chose."""
    return sum(1 for message in messages if message.get("role") == "assistant") - 1


def _repeated_id(calls: list[dict[str, Any]]) -> str | None:
    seen: set[str] = set()
    for call in calls:
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in seen:
            return repr(call_id)
        seen.add(call_id)
    return None


def _arguments(call: dict[str, Any]) -> Any:
    """The call's arguments, parsed; raises ValueError when they are not JSON."""
    return json.loads(call.get("function", {}).get("arguments") or "{}")


class AgentDriver(Driver):
    rejection_continues = True  # a rejected tool call is an error result the model sees

    def proposed_arguments(self, run: Run, binding: dict[str, Any]) -> Any:
        """The arguments the model proposed for the paused call, as they stand in the run's
        messages (None if the binding is not a call of the turn the run waits in)."""
        messages = list((run.driver_state or {}).get("messages") or [])
        calls = _pending_calls(messages)
        position = binding.get("position")
        if not isinstance(position, int) or not 0 <= position < len(calls):
            return None
        call = calls[position]
        try:
            arguments = _arguments(call)
        except json.JSONDecodeError:
            return None
        name = call.get("function", {}).get("name", "")
        shown_for = call_binding(name, arguments, turn=_turn(messages), position=position)
        return arguments if shown_for == binding else None

    def step(self, run: Run, answers: Answers) -> StepResult:
        state = run.driver_state
        messages: list[dict[str, Any]] = list(state["messages"])
        results: dict[str, str] = dict(state.get("results") or {})

        def ended(status: str, **how: Any) -> StepResult:
            return StepResult(status, driver_state={**state, "messages": messages, "results": results}, **how)

        try:
            model = resolve_model(state["model"])
            tools = tool_specs(state["tools"])
        except (ModelError, UnknownAction) as exc:
            return ended(Run.Status.FAILED, error=str(exc))

        calls = _pending_calls(messages)
        for asked in range(MAX_TURNS + 1):
            if (repeated := _repeated_id(calls)) is not None:
                # Results, and the model's view of them, are matched to calls by id: a turn
                # that repeats one cannot be answered unambiguously, so it is not run at all.
                return ended(
                    Run.Status.FAILED,
                    error=f"the model's turn {_turn(messages) + 1} repeats or lacks a tool call id "
                    f"({repeated}); each call of a turn needs its own id",
                )
            pauses = _run_calls(run.pk, set(state["tools"]), _turn(messages), calls, results, answers)
            if pauses:
                return ended(Run.Status.INTERRUPTED, pauses=pauses)
            for call in calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": results.pop(call["id"])}
                )
            if asked == MAX_TURNS:
                break
            try:
                reply = model.complete(messages, tools)
            except ModelError as exc:
                return ended(Run.Status.FAILED, error=str(exc))
            reply["role"] = "assistant"
            messages.append(reply)
            if not reply.get("tool_calls"):
                return ended(Run.Status.COMPLETED, output=reply.get("content") or "")
            calls = _pending_calls(messages)
        return ended(Run.Status.FAILED, error=f"the agent took more than {MAX_TURNS} turns")


def _run_calls(
    run_id: int,
    allowed: set[str],
    turn: int,
    calls: list[dict[str, Any]],
    results: dict[str, str],
    answers: Answers,
) -> list[Pause]:
    """Run every call of the turn that has no result yet; return the pauses of those that
    interrupt.

    An interrupt's answer applies to the call it was shown for, identified by turn, position,
    action and arguments (never by the model's id alone, which some servers reuse across
    turns): any other call runs without it, and pauses again if it asks."""
    pauses = []
    for position, call in enumerate(calls):
        call_id = call["id"]
        if call_id in results:
            continue  # finished earlier in this turn: never run twice
        name = call.get("function", {}).get("name", "")
        if name not in allowed:
            results[call_id] = f"error: there is no tool named {name!r}"
            continue
        try:
            arguments = _arguments(call)
        except json.JSONDecodeError:
            results[call_id] = "error: the arguments are not valid JSON"
            continue
        binding = call_binding(name, arguments, turn=turn, position=position)
        answer = answers.for_call(binding)
        if answer is not None and not answer.approved:
            results[call_id] = f"error: rejected by {answer.decided_by}: {answer.reason}"
            continue
        resumption = answer.resumption if answer is not None else None
        if answer is not None and answer.arguments is not None:
            # Approved as the reviewer edited it: the call runs with those arguments, and the
            # model sees its call so (it may pause again: its binding is of the edited call).
            arguments = answer.arguments
            call["function"] = {**call.get("function", {}), "arguments": json.dumps(arguments)}
            binding = call_binding(name, arguments, turn=turn, position=position)
        outcome = invoke(name, arguments, resumption, run_id=run_id)
        if isinstance(outcome, Interrupted):
            pauses.append(
                Pause(
                    outcome.message,
                    outcome.data,
                    outcome.state,
                    tool_call_id=call_id,
                    action=name,
                    binding=binding,
                    arguments=arguments,
                )
            )
        else:
            results[call_id] = _result_text(run_id, outcome)
    return pauses
