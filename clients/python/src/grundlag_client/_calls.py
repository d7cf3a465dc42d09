"""What the agent frameworks' adapters share: asking the team about one tool call (its
arguments editable where the framework can run it with others) and waiting for the decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grundlag_client import Approval, Client

MAX_MESSAGE = 2000


@dataclass(frozen=True)
class ToolDecision:
    """What the team decided about a tool call: ``arguments`` as approved (edited where the
    reviewer edited them), or the ``reason`` it was not ("rejected", "expired", "cancelled"
    in ``status``)."""

    approved: bool
    status: str
    arguments: dict[str, Any] = field(default_factory=dict)
    edited: bool = False
    reason: str = ""
    approval_id: int | None = None


def ask_tool_call(
    client: Client,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    agent: str = "",
    editable: bool = True,
    schema: Mapping[str, Any] | None = None,
    key: str = "",
    timeout: float | None = None,
    deadline_seconds: int | None = None,
) -> ToolDecision:
    """Ask the team whether ``agent`` may call ``tool`` with ``arguments``, and wait (up to
    ``timeout`` seconds: then TimedOut, the approval left pending). ``editable``: the reviewer
    may change the arguments, one field each, typed as each value is (its ``description`` from
    the tool's JSON ``schema`` when there is one). ``key``: the Idempotency-Key, so that asking
    again (a process picked up again) finds the same approval."""
    arguments = dict(arguments)
    who = f"{agent} wants to call {tool}" if agent else f"Call {tool}"
    data = {"tool": tool, "arguments": arguments, **({"agent": agent} if agent else {})}
    form = edit_schema(arguments, schema) if editable else None
    approval = decided(client, f"{who}?"[:MAX_MESSAGE], data, form, key, timeout, deadline_seconds)
    if approval.status != "approved":
        reason = approval.reason or f"The call was {approval.status} in the inbox."
        return ToolDecision(False, approval.status, arguments, reason=reason, approval_id=approval.id)
    answer = approval.answer if isinstance(approval.answer, Mapping) else {}
    approved = {**arguments, **answer} if editable else arguments
    return ToolDecision(True, "approved", approved, edited=approved != arguments, approval_id=approval.id)


def edit_schema(arguments: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The approve form: a field for each argument, filled in with the proposed value."""
    described = (schema or {}).get("properties") or {}
    properties = {}
    for name, value in arguments.items():
        prop: dict[str, Any] = {**type_of(value), "title": str(name), "default": value}
        if isinstance(described.get(name), Mapping) and isinstance(described[name].get("description"), str):
            prop["description"] = described[name]["description"]
        properties[str(name)] = prop
    return {"type": "object", "properties": properties}


def type_of(value: Any) -> dict[str, Any]:
    """The JSON Schema type of ``value``, for its field: a number stays a number."""
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        return {"type": "array"}
    if isinstance(value, Mapping):
        return {"type": "object"}
    return {}


def decided(
    client: Client,
    message: str,
    data: Any,
    schema: dict[str, Any] | None,
    key: str,
    timeout: float | None,
    deadline_seconds: int | None,
) -> Approval:
    """Ask, then hold until it is decided."""
    approval = client.create_approval(
        message, data, answer_schema=schema, deadline_seconds=deadline_seconds, idempotency_key=key
    )
    if not approval.decided:
        approval = client.wait_for_approval(approval.id, timeout=timeout)
    return approval
