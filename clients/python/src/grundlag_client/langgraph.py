"""LangGraph's interrupts, asked in a team's inbox: ``pip install "grundlag-client[langgraph]"``.

``run_with_inbox(graph, input, config, client=...)`` invokes a compiled graph (with its own
checkpointer, where its state stays); each time it stops at ``interrupt()``, every pending
interrupt is asked as an approval in the team's inbox (its rules, notifications, deadlines,
N-of-M and audit apply), and the graph is resumed with ``Command(resume=...)`` and what the
person decided, until it ends. Its result is the graph's.

An interrupt in LangChain's Agent Inbox form (``HumanInterrupt``: ``action_request`` with
``action`` and ``args``, ``config`` with ``allow_accept``, ``allow_edit``, ``allow_respond``,
``allow_ignore``, and a ``description``) is asked as such: the action and its arguments, and
exactly the responses its config allows (accept; edit the arguments, one field each; respond
with text; ignore). It resumes with the matching ``HumanResponse`` (``{"type": "accept" |
"edit" | "response" | "ignore", "args": ...}``), a list of them when the interrupt was a list,
as Agent Inbox does. A rejection in the inbox is an ``ignore`` where the config allows one, else
a ``response`` with the reviewer's reason where that is allowed, else ``Rejected``.

Any other value is asked as a plain approval (a string is the question; anything else is shown
as the data), and resumes with the answer (``{"approved": true, "comment": ...}``) or, when
rejected, ``{"approved": false, "reason": ...}``.

Each interrupt is asked with an Idempotency-Key made of the graph's thread and the interrupt's
id: a process that died while it waited, run again, finds the same approval, not a second one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grundlag_client import Approval, Client, Rejected
from grundlag_client._calls import (
    MAX_EDIT_FORM_BYTES,
    MAX_MESSAGE,
    as_json,
    decided,
    edit_schema,
    edited,
    key_part,
)

try:
    from langgraph.types import Command
except ImportError as exc:  # pragma: no cover - said once, plainly
    raise ImportError(
        'grundlag_client.langgraph needs LangGraph: pip install "grundlag-client[langgraph]"'
    ) from exc

__all__ = [
    "arun_with_inbox",
    "ask",
    "ask_inbox",
    "is_human_interrupt",
    "resume_from_webhook",
    "run_with_inbox",
]

RESPONSES = {
    "allow_accept": "accept",
    "allow_edit": "edit",
    "allow_respond": "response",
    "allow_ignore": "ignore",
}
EXPLAINED = {
    "accept": "accept: run it as it is",
    "edit": "edit: run it with the arguments below",
    "response": "response: send the text below instead",
    "ignore": "ignore: skip it",
}
ARG = "args."  # an edited argument's field in the answer: "args.<name>"


def run_with_inbox(
    graph: Any,
    input: Any,
    config: Mapping[str, Any],
    *,
    client: Client,
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    resume_rejected: bool = False,
) -> Any:
    """Invoke ``graph`` with ``input`` until it ends, asking the team for each interrupt on the
    way; the graph's final result. ``timeout``: how long to wait for each decision (None: for
    ever; then TimedOut, the approval left pending); ``deadline_seconds``: the inbox's own
    deadline for each. A plain question rejected raises Rejected (the graph stays where it
    paused), unless ``resume_rejected``: then it resumes with ``{"approved": False, "reason"}``."""
    result = graph.invoke(input, config)
    config = _latest(config)
    while pending := _pending(graph.get_state(config)):
        answers = _answers(client, config, pending, timeout, deadline_seconds, resume_rejected)
        result = graph.invoke(Command(resume=answers), config)
    return result


async def arun_with_inbox(
    graph: Any,
    input: Any,
    config: Mapping[str, Any],
    *,
    client: Client,
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    resume_rejected: bool = False,
) -> Any:
    """``run_with_inbox`` for an async graph (``ainvoke``); the waits run in a thread, so the
    event loop goes on meanwhile."""
    result = await graph.ainvoke(input, config)
    config = _latest(config)
    while pending := _pending(await graph.aget_state(config)):
        answers = await asyncio.to_thread(
            _answers, client, config, pending, timeout, deadline_seconds, resume_rejected
        )
        result = await graph.ainvoke(Command(resume=answers), config)
    return result


def _answers(
    client: Client,
    config: Mapping[str, Any],
    pending: tuple[Any, ...],
    timeout: float | None,
    deadline_seconds: int | None,
    resume_rejected: bool,
) -> dict[str, Any]:
    """Each pending interrupt asked and decided: what to resume the graph with."""
    return {
        interrupt.id: ask(
            client,
            interrupt.value,
            key=_key(config, interrupt.id),
            timeout=timeout,
            deadline_seconds=deadline_seconds,
            resume_rejected=resume_rejected,
        )
        for interrupt in pending
    }


def _latest(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config without a checkpoint to start from (time travel): from the first invoke on,
    the thread's latest checkpoint is the one that pauses and resumes."""
    configurable = {k: v for k, v in (config.get("configurable") or {}).items() if k != "checkpoint_id"}
    return {**config, "configurable": configurable}


def _pending(state: Any) -> tuple[Any, ...]:
    """The interrupts the graph waits on; a graph stopped at a breakpoint (interrupt_before or
    interrupt_after) asks nobody anything, and is not taken for one that ended."""
    if not state.interrupts and state.next:
        raise RuntimeError(
            f"the graph stopped before {', '.join(state.next)} at a breakpoint, not at interrupt(): "
            "there is no question for the inbox; resume it with invoke(None, config)"
        )
    return tuple(state.interrupts)


def ask(
    client: Client,
    value: Any,
    *,
    key: str = "",
    timeout: float | None = None,
    deadline_seconds: int | None = None,
    resume_rejected: bool = False,
) -> Any:
    """Ask the team about one interrupt's value and wait for the decision; what to resume with."""
    questions, listed = _questions(value, resume_rejected)
    answers = [
        question.answer(
            decided(
                client,
                question.message,
                question.data,
                question.schema,
                _part(key, n, listed),
                timeout,
                deadline_seconds,
            )
        )
        for n, question in enumerate(questions)
    ]
    return answers if listed else answers[0]


def is_human_interrupt(value: Any) -> bool:
    """Whether ``value`` has Agent Inbox's ``HumanInterrupt`` shape."""
    request = value.get("action_request") if isinstance(value, Mapping) else None
    return (
        isinstance(request, Mapping)
        and isinstance(request.get("action"), str)
        and isinstance(request.get("args", {}), Mapping)
        and isinstance(value.get("config"), Mapping)
    )


@dataclass(frozen=True)
class _Question:
    """An interrupt's value as the inbox asks it, and how its decision answers the graph."""

    message: str
    data: Any
    schema: dict[str, Any] | None
    answer: Callable[[Approval], Any]


def _questions(
    value: Any, resume_rejected: bool, meta: dict[str, Any] | None = None
) -> tuple[list[_Question], bool]:
    """The questions an interrupt's value asks (several for a list of HumanInterrupts, as
    Agent Inbox sends them: then answered as a list too). ``meta``: the thread and interrupt,
    kept in the question's data (server mode: the webhook's handler finds the thread by it)."""
    value = as_json(value)
    if is_human_interrupt(value):
        return [_human_question(value, meta)], False
    if isinstance(value, list) and value and all(is_human_interrupt(each) for each in value):
        return [_human_question(each, meta and {**meta, "part": n}) for n, each in enumerate(value)], True
    text = value.strip() if isinstance(value, str) else ""
    message = text[:MAX_MESSAGE] if text else "Approve this step?"
    # A question longer than the inbox's title is shown whole as its data.
    data = {"text": value} if len(text) > MAX_MESSAGE else (None if isinstance(value, str) else value)
    if meta is not None:
        data = {**({"question": data} if data is not None else {}), "langgraph": meta}

    def answer(approval: Approval) -> Any:
        if approval.status == "approved":
            return approval.answer
        if approval.status == "rejected" and resume_rejected:
            return {"approved": False, "reason": approval.reason}
        raise Rejected(approval.reason, approval.status, approval)

    return [_Question(message, data, None, answer)], False


def _human_question(value: Mapping[str, Any], meta: dict[str, Any] | None) -> _Question:
    action = value["action_request"]["action"]
    args = dict(value["action_request"].get("args") or {})
    config = value["config"]
    allowed = [response for flag, response in RESPONSES.items() if config.get(flag)]
    if not allowed:
        raise ValueError(f"the interrupt for {action!r} allows no response (every allow_* is false)")
    if "edit" in allowed and len(json.dumps(answer_schema(args, allowed))) > MAX_EDIT_FORM_BYTES:
        # Too big to edit field by field (the server takes schemas up to 16 KB): not offered.
        allowed = [each for each in allowed if each != "edit"] or ["accept"]
    description = str(value.get("description") or "").strip()
    message = (description or f"Review {action}")[:MAX_MESSAGE]
    data = {"action": action, "args": args, **({"langgraph": meta} if meta is not None else {})}

    def answer(approval: Approval) -> dict[str, Any]:
        if approval.status == "approved":
            return human_response(action, args, approval.answer)
        if approval.status == "rejected":
            # The reviewer's reason goes back where the interrupt takes text; else it is skipped.
            if "response" in allowed and (approval.reason or "ignore" not in allowed):
                return {"type": "response", "args": approval.reason}
            if "ignore" in allowed:
                return {"type": "ignore", "args": None}
        raise Rejected(approval.reason, approval.status, approval)

    return _Question(message, data, answer_schema(args, allowed), answer)


def _part(key: str, n: int, listed: bool) -> str:
    return f"{key}:{n}" if key and listed else key


# Server mode: ask, return, and resume the thread when the team's webhook says it was decided.


def ask_inbox(
    graph: Any,
    input: Any,
    config: Mapping[str, Any],
    *,
    client: Client,
    deadline_seconds: int | None = None,
) -> list[Approval]:
    """Invoke ``graph`` until it pauses, ask the team each of its interrupts, and return at
    once with the approvals asked (none: the graph ended). The graph's state stays in its
    checkpointer; when the team decides, its ``run.finished`` webhook reaches your service,
    whose handler calls ``resume_from_webhook``, in whichever process gets it."""
    graph.invoke(input, config)
    return _ask_pending(graph, _latest(config), client, deadline_seconds)


def resume_from_webhook(
    graph: Any,
    event: Mapping[str, Any],
    *,
    client: Client,
    config: Mapping[str, Any] | None = None,
    deadline_seconds: int | None = None,
    resume_rejected: bool = False,
) -> Any:
    """Resume the thread a decided question belongs to. ``event``: the body of a
    ``run.finished`` webhook, verified. ``config``: what your graph needs besides the thread
    (the thread comes from the question). Returns the graph's result, having asked the
    questions it paused with next; None when the event is not about one of this graph's
    questions, the thread was resumed already (a webhook sent again), or it still waits for
    another part of the same interrupt. Give the same ``deadline_seconds`` as ``ask_inbox``.
    Handle one thread's webhooks one at a time (a thread resumed twice at once would race in
    the checkpointer)."""
    data = event.get("data") or {}
    if event.get("type") != "run.finished" or data.get("consumer") != "approval":
        return None
    approval = client.get_approval(int(data["id"]))
    meta = approval.data.get("langgraph") if isinstance(approval.data, Mapping) else None
    if not isinstance(meta, Mapping) or not meta.get("thread_id"):
        return None
    configurable = {**((config or {}).get("configurable") or {}), "thread_id": meta["thread_id"]}
    thread = _latest({**(config or {}), "configurable": configurable})
    pending = graph.get_state(thread).interrupts
    interrupt = next((each for each in pending if each.id == meta.get("interrupt_id")), None)
    if interrupt is None:
        # Resumed already (a delivery sent again, or a handler that stopped before it asked
        # what came next): ask what the thread waits on now, which asks nothing twice.
        _ask_pending(graph, thread, client, deadline_seconds)
        return None
    questions, listed = _questions(interrupt.value, resume_rejected)
    if listed:
        # The other parts are found again by their keys (kept 24 hours per token).
        asked = _post(client, thread, interrupt, deadline_seconds)
        decisions = [client.get_approval(each.id) for each in asked]  # a replay is as first answered
    else:
        decisions = [approval]  # the event's own: however long ago it was asked
    if approval.id not in {each.id for each in decisions} or any(d.status == "pending" for d in decisions):
        return None  # not one of this interrupt's questions, or a part still waits
    answers = [question.answer(each) for question, each in zip(questions, decisions, strict=True)]
    result = graph.invoke(Command(resume={interrupt.id: answers if listed else answers[0]}), thread)
    _ask_pending(graph, thread, client, deadline_seconds)
    return result


def _ask_pending(
    graph: Any, config: Mapping[str, Any], client: Client, deadline_seconds: int | None
) -> list[Approval]:
    asked: list[Approval] = []
    for interrupt in _pending(graph.get_state(config)):
        asked += _post(client, config, interrupt, deadline_seconds)
    return asked


def _post(
    client: Client, config: Mapping[str, Any], interrupt: Any, deadline_seconds: int | None
) -> list[Approval]:
    """Ask an interrupt's questions without waiting; asked again, the same approvals (the
    same Idempotency-Keys and bodies)."""
    thread = str((config.get("configurable") or {}).get("thread_id", ""))
    if not thread:
        raise ValueError("server mode needs the graph's thread: config['configurable']['thread_id']")
    meta = {"thread_id": thread, "interrupt_id": interrupt.id}
    questions, listed = _questions(interrupt.value, False, meta)
    key = "langgraph-server:" + _key(config, interrupt.id).removeprefix("langgraph:")
    return [
        client.create_approval(
            question.message,
            question.data,
            answer_schema=question.schema,
            deadline_seconds=deadline_seconds,
            idempotency_key=_part(key, n, listed),
        )
        for n, question in enumerate(questions)
    ]


def answer_schema(args: Mapping[str, Any], allowed: list[str]) -> dict[str, Any]:
    """The form a reviewer answers: which response, the text of one, each argument to edit."""
    properties: dict[str, Any] = {
        "decision": {
            "type": "string",
            "enum": allowed,
            "default": allowed[0],
            "title": "Response",
            "description": "; ".join(EXPLAINED[each] for each in allowed),
        }
    }
    # No other answer than this form's (a bulk approval's {approved, comment} is left out).
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": ["decision"],
        "additionalProperties": False,
    }
    if "response" in allowed:
        properties["response"] = {"type": "string", "maxLength": 4000, "title": "Response text"}
        # A response says something: its text is asked for when it is the one chosen.
        schema["if"] = {"properties": {"decision": {"const": "response"}}, "required": ["decision"]}
        schema["then"] = {"required": ["response"], "properties": {"response": {"minLength": 1}}}
    if "edit" in allowed:
        for name, prop in edit_schema(args)["properties"].items():
            properties[ARG + name] = prop  # typed as proposed; long or multi-line text in a text box
    return schema


def human_response(action: str, args: Mapping[str, Any], answer: Mapping[str, Any]) -> dict[str, Any]:
    """Agent Inbox's ``HumanResponse`` for the reviewer's answer. Arguments changed in the form
    are an edit, whichever response was left chosen: what the reviewer approves is what runs."""
    decision = answer.get("decision")
    changed = edited(
        args, {name[len(ARG) :]: value for name, value in answer.items() if name.startswith(ARG)}
    )
    if decision == "edit" or (decision == "accept" and changed != dict(args)):
        return {"type": "edit", "args": {"action": action, "args": changed}}
    if decision == "response":
        return {"type": "response", "args": str(answer.get("response") or "")}
    if decision in ("accept", "ignore"):
        return {"type": decision, "args": None}
    raise ValueError(f"not a response Agent Inbox knows: {decision!r}")


def _key(config: Mapping[str, Any], interrupt_id: str) -> str:
    thread = str((config.get("configurable") or {}).get("thread_id", ""))
    if not thread:
        return ""  # no thread, no way to know the same interrupt again
    return f"langgraph:{key_part(thread)}:{key_part(str(interrupt_id))}"
