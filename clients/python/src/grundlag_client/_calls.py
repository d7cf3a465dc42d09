"""What the agent frameworks' adapters share: asking the team about one tool call (its
arguments editable where the framework can run it with others) and waiting for the decision."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grundlag_client import Approval, Client

MAX_MESSAGE = 4000  # the server's limit on a question
# An edit form repeats each argument as its default: past this, the call is asked without one
# (the server takes schemas up to 16 KB).
MAX_EDIT_FORM_BYTES = 12_000


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
    proposed: dict[str, Any] = as_json(dict(arguments))
    who = f"{agent} wants to call {tool}" if agent else f"Call {tool}"
    data = {"tool": tool, "arguments": proposed, **({"agent": agent} if agent else {})}
    form = edit_schema(proposed, schema) if editable else None
    if form is not None and len(json.dumps(form)) > MAX_EDIT_FORM_BYTES:
        form = None  # too big to edit field by field: approved or rejected as proposed
    approval = decided(client, f"{who}?"[:MAX_MESSAGE], data, form, key, timeout, deadline_seconds)
    if approval.status != "approved":
        reason = approval.reason or f"The call was {approval.status} in the inbox."
        return ToolDecision(False, approval.status, proposed, reason=reason, approval_id=approval.id)
    if form is None:
        return ToolDecision(True, "approved", proposed, approval_id=approval.id)
    approved = edited(proposed, approval.answer)
    return ToolDecision(True, "approved", approved, edited=approved != proposed, approval_id=approval.id)


def edited(arguments: Mapping[str, Any], answer: Any) -> dict[str, Any]:
    """The arguments with what the reviewer changed put on top. Only the arguments' own names
    count (an answer a rule or a bulk approval gave carries others), and a value that differs
    only as a browser's field changes text (trimmed, CRLF line ends) keeps the proposed one."""
    result = dict(arguments)
    for name, value in answer.items() if isinstance(answer, Mapping) else ():
        if name in result and not same(result[name], value):
            result[name] = value
    return result


def same(proposed: Any, answered: Any) -> bool:
    if isinstance(proposed, str) and isinstance(answered, str):
        return proposed.replace("\r\n", "\n").strip() == answered.replace("\r\n", "\n").strip()
    return bool(proposed == answered)


def as_json(value: Any) -> Any:
    """``value`` as JSON would carry it (a datetime, a message object: as text)."""
    return json.loads(json.dumps(value, default=str))


def key_part(text: str) -> str:
    """Any text (a thread's id, a caller's key) as a short ASCII part of an Idempotency-Key."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def edit_schema(arguments: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The approve form: a field for each argument, filled in with the proposed value."""
    described = (schema or {}).get("properties") or {}
    properties = {}
    for name, value in arguments.items():
        prop: dict[str, Any] = {**type_of(value), "title": str(name), "default": value}
        if isinstance(value, str) and ("\n" in value or len(value) > 200):
            prop["maxLength"] = 65_536  # a text box, which keeps its lines, not a one-line field
        if isinstance(described.get(name), Mapping) and isinstance(described[name].get("description"), str):
            prop["description"] = described[name]["description"]
        properties[str(name)] = prop
    # What is not an argument is no answer to this form (a bulk approval's {approved, comment}).
    return {"type": "object", "properties": properties, "additionalProperties": False}


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
