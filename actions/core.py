"""The interrupt contract: how an action pauses itself and how it is resumed.

This module imports nothing from Django, so the contract can be read, used and tested alone.

An action raises :class:`ActionInterrupt` to pause. Whoever drives it (the dashboard, the HTTP
API, an agent loop, a sandboxed script) catches the interrupt through :func:`invoke`, stores it,
and later calls the same action again from the top with ``ctx.resumption`` set.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, TypeAlias

from pydantic import BaseModel, ValidationError

from actions.conditions import Condition, ConditionError, compile_condition

__all__ = [
    "Action",
    "ActionContext",
    "ActionError",
    "ActionInterrupt",
    "ActionResumption",
    "ApprovalPolicy",
    "Approve",
    "AssignTo",
    "ConditionError",
    "Completed",
    "Failed",
    "Interrupted",
    "Outcome",
    "Reject",
    "RequireApprovals",
    "RouteTo",
    "Rule",
    "UnknownAction",
    "action",
    "compile_condition",
    "invoke",
    "json_problem",
    "registry",
]


def json_problem(value: Any, path: str = "$") -> str | None:
    """Say why ``value`` cannot be stored as JSON, or return None when it can.

    The answer names the offending value by its path (``$.items[2]``), so the author of an
    action learns which part of their payload is wrong, not merely that one is.
    """
    if value is None or isinstance(value, (bool, str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot represent"
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if problem := json_problem(item, f"{path}[{index}]"):
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a key {key!r} of type {type(key).__name__}; JSON keys are strings"
            if problem := json_problem(item, f"{path}.{key}"):
                return problem
        return None
    return f"{path} is a {type(value).__name__}, which is not JSON-serialisable"


# How deeply a stored value may nest. Pages, exports and the admin render what is stored; an
# attacker chooses the depth of what they send, so it is bounded where anything is stored.
MAX_NESTING = 32


def _text_problem(text: str) -> str | None:
    """Why a string cannot be stored: "not_unicode" (a lone surrogate) or "nul" (the NUL
    character): JSON can carry both, PostgreSQL stores neither. None when it can be."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "not_unicode"
    return "nul" if "\x00" in text else None


def value_problem(value: Any, max_depth: int = MAX_NESTING) -> tuple[str, list[Any]] | None:
    """("too_deep" | "not_finite" | "not_unicode" | "nul", path) for the first place ``value``
    cannot be stored, or None. Walked without recursion: the depth is the caller's choice.

    Every value stored passes here, requests' data included: a value that plainly has no
    problem is told apart in C (json's encoder) and by a walk over its containers only, 15
    times faster than the walk that names the path (27 ms for a list of 20,000 numbers, with
    the interpreter held meanwhile), which runs only where there may be a problem."""
    if _plainly_storable(value, max_depth):
        return None
    return _first_problem(value, max_depth)


def _first_problem(value: Any, max_depth: int) -> tuple[str, list[Any]] | None:
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return ("not_finite", path)
        if isinstance(item, str) and (problem := _text_problem(item)):
            return (problem, path)
        if isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and (problem := _text_problem(key)):
                    return (problem, [*path, key.encode("utf-8", "backslashreplace").decode()])
            children: list[tuple[Any, Any]] = list(item.items())
        elif isinstance(item, (list, tuple)):
            children = list(enumerate(item))
        else:
            continue
        if len(path) >= max_depth:
            return ("too_deep", path)
        stack.extend((child, [*path, key]) for key, child in reversed(children))
    return None


def _plainly_storable(value: Any, max_depth: int) -> bool:
    """True when ``value`` has none of value_problem's problems; False when it may have one."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)  # refuses NaN and Infinity
        text.encode("utf-8")  # refuses lone surrogates
    except (ValueError, TypeError, RecursionError):
        return False
    if "\\u0000" in text:  # NUL, as json writes it (or a backslash before "u0000": looked at)
        return False
    if not isinstance(value, (dict, list, tuple)):
        return True  # a scalar does not nest, whatever brackets its text holds
    if text.count("[") + text.count("{") <= max_depth:
        return True  # too few brackets, strings' included, to nest that deep
    containers: list[tuple[Any, int]] = [(value, 0)]
    while containers:
        item, depth = containers.pop()
        if depth >= max_depth:
            return False
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, (dict, list, tuple)):
                containers.append((child, depth + 1))
    return True


class ActionError(Exception):
    """Raised by an action to fail its run with exactly this message (no exception type)."""


class ActionInterrupt(Exception):  # noqa: N818 - the name is the contract
    """Raised by an action to pause until a person (or a calling program) answers.

    ``message`` is human text saying why; ``data`` is what the caller sees and must satisfy;
    ``state`` is the action's private checkpoint, persisted with the interrupt, never shown to
    anyone, and handed back verbatim in ``ctx.resumption.state``. Both must be JSON: a value
    that is not fails here, at raise time, where the traceback points at the culprit.
    """

    def __init__(self, message: str, data: Any = None, state: Any = None) -> None:
        if not isinstance(message, str) or not message.strip():
            raise TypeError("ActionInterrupt needs a non-empty message string")
        for name, value in (("data", data), ("state", state)):
            if problem := json_problem(value, name):
                raise TypeError(f"ActionInterrupt {name} must be JSON-serialisable: {problem}")
        super().__init__(message)
        self.message = message
        self.data = data
        self.state = state


@dataclass(frozen=True)
class ActionResumption:
    """What a resumed action receives: the answer, and the checkpoint it saved when it paused."""

    data: Any
    state: Any = None


@dataclass(frozen=True)
class ActionContext:
    input: Any
    resumption: ActionResumption | None = None
    run_id: int | None = None


Execute: TypeAlias = Callable[[ActionContext], Any] | Callable[[ActionContext], Awaitable[Any]]


# Rules: what a machine may decide for the team. A condition is CEL (common-expression-language)
# over what is asked (actions.conditions); it is compiled once, where it is declared or saved.


@dataclass(frozen=True)
class Approve:
    """Approve with ``answer`` (None: as the plain approve form does, {"approved": true})."""

    answer: Any = None

    def describe(self) -> str:
        return "approve" if self.answer is None else f"approve with {json.dumps(self.answer)}"


@dataclass(frozen=True)
class Reject:
    reason: str

    def __post_init__(self) -> None:
        if not self.reason or not self.reason.strip():
            raise ValueError("a rule that rejects must give a reason")

    def describe(self) -> str:
        return f"reject: {self.reason}"


@dataclass(frozen=True)
class RequireApprovals:
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("a rule must require at least 1 approval")

    def describe(self) -> str:
        return f"require {self.count} approvals"


@dataclass(frozen=True)
class AssignTo:
    users: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.users:
            raise ValueError("a rule that assigns must name at least one user")

    def describe(self) -> str:
        return f"assign to {', '.join(self.users)}"


@dataclass(frozen=True)
class RouteTo:
    team: str

    def describe(self) -> str:
        return f"route to {self.team}"


RuleOutcome: TypeAlias = Approve | Reject | RequireApprovals | AssignTo | RouteTo


@dataclass(frozen=True)
class Rule:
    """``then`` for every interrupt of the action whose ``when`` (CEL) is true. Compiled here:
    a condition that is not CEL is refused where it is declared, naming the position."""

    name: str
    when: str
    then: RuleOutcome
    program: Condition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("a rule needs a name")
        if not isinstance(self.then, (Approve, Reject, RequireApprovals, AssignTo, RouteTo)):
            # then="approve" was a rule that never applied, silently.
            raise TypeError(
                f"rule {self.name!r}: then must be Approve(), Reject(reason), RequireApprovals(n), "
                f"AssignTo(users) or RouteTo(team), not {self.then!r}"
            )
        try:
            program = compile_condition(self.when)
        except ConditionError as exc:
            raise ConditionError(exc.reason, exc.line, exc.column, subject=f"rule {self.name!r}: ") from None
        object.__setattr__(self, "program", program)


@dataclass(frozen=True)
class ApprovalPolicy:
    """How the pauses of an action are decided. A team may override it (admin: Policies)."""

    # After this long without a decision: apply ``default_answer`` as if approved with it, or,
    # when there is none (None), expire the interrupt and fail the run.
    deadline: timedelta | None = None
    default_answer: Any = None
    # After this long without a decision, the team with this slug sees (and may decide) it too.
    escalate_after: timedelta | None = None
    escalate_to: str | None = None
    # Distinct people who must approve (2: four eyes). Any single rejection rejects.
    approvals: int = 1
    # Usernames: only they may decide. Empty: any member of the team.
    assignees: tuple[str, ...] = ()
    # False: whoever started the run may not approve its pauses (separation of duties). On by
    # default: an agent's user approving its agent's calls, an API caller answering its own run.
    requester_may_approve: bool = True
    # Evaluated in order when an interrupt is created, after the team's own rules; the first
    # whose condition holds decides (or assigns, routes, requires approvals).
    rules: tuple[Rule, ...] = ()
    # False: no rule or standing grant approves it; a person must (it may still reject).
    auto_approve: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if not self.auto_approve and any(isinstance(rule.then, Approve) for rule in self.rules):
            raise ValueError("a rule approves an action whose policy forbids automatic approval")
        if self.approvals < 1:
            raise ValueError("approvals must be at least 1")
        if (self.escalate_after is None) != (self.escalate_to is None):
            raise ValueError("escalate_after and escalate_to go together")
        if problem := json_problem(self.default_answer, "default_answer"):
            raise TypeError(problem)


@dataclass(frozen=True)
class Action:
    name: str
    execute: Execute
    input_model: type[BaseModel]
    answer_model: type[BaseModel] | None = None
    description: str = ""
    policy: ApprovalPolicy = ApprovalPolicy()
    # Templates read an action's attributes; being callable, it would otherwise be called.
    do_not_call_in_templates: ClassVar[bool] = True

    def input_schema(self) -> dict[str, Any]:
        return self.input_model.model_json_schema()

    def answer_schema(self) -> dict[str, Any] | None:
        return self.answer_model.model_json_schema() if self.answer_model else None

    def validate_answer(self, answer: Any) -> Any:
        """Validate a reviewer's answer; returns it as JSON. Raises pydantic.ValidationError."""
        if self.answer_model is None:
            return answer
        return self.answer_model.model_validate(answer).model_dump(mode="json")

    def __call__(self, ctx: ActionContext) -> Any:
        return self.execute(ctx)


class UnknownAction(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no action named {name!r}")
        self.name = name


class Registry:
    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}

    def register(self, act: Action) -> Action:
        existing = self._actions.get(act.name)
        if existing is not None and existing.execute is not act.execute:
            qualname = getattr(existing.execute, "__qualname__", existing.execute)
            raise ValueError(f"an action named {act.name!r} is already registered ({qualname})")
        self._actions[act.name] = act
        return act

    def get(self, name: str) -> Action:
        try:
            return self._actions[name]
        except KeyError:
            raise UnknownAction(name) from None

    def find(self, name: str) -> Action | None:
        """The action, or None where an unknown name is not an error (an agent run's name)."""
        return self._actions.get(name)

    def all(self) -> list[Action]:
        return sorted(self._actions.values(), key=lambda act: act.name)

    def __contains__(self, name: object) -> bool:
        return name in self._actions

    def __iter__(self) -> Iterator[Action]:
        return iter(self.all())


registry = Registry()


def action(
    name: str | None = None,
    *,
    input: type[BaseModel],  # noqa: A002 - the contract's name for it
    answer: type[BaseModel] | None = None,
    description: str | None = None,
    policy: ApprovalPolicy | None = None,
) -> Callable[[Execute], Action]:
    """Register ``execute(ctx)`` (sync or async) as an action and return the :class:`Action`."""

    def decorate(execute: Execute) -> Action:
        doc = inspect.getdoc(execute) or ""
        named = name or execute.__name__
        if policy is not None and answer is not None:
            # Refused where they are declared, not months later when a deadline passes or a
            # rule matches.
            fixed = [("the default_answer", policy.default_answer)] + [
                (f"rule {rule.name!r}'s answer", rule.then.answer)
                for rule in policy.rules
                if isinstance(rule.then, Approve) and rule.then.answer is not None
            ]
            for what, value in fixed:
                if value is None:
                    continue
                try:
                    answer.model_validate(value)
                except ValidationError as exc:
                    errors = describe_errors(field_errors(exc))
                    raise TypeError(f"{what} of {named} does not fit its answer model: {errors}") from None
        act = Action(
            name=named,
            execute=execute,
            input_model=input,
            answer_model=answer,
            description=description if description is not None else doc,
            policy=policy or ApprovalPolicy(),
        )
        return registry.register(act)

    return decorate


@dataclass(frozen=True)
class Completed:
    output: Any


@dataclass(frozen=True)
class Interrupted:
    message: str
    data: Any
    state: Any


@dataclass(frozen=True)
class Failed:
    error: str
    # Pydantic's error list when the input was invalid, for callers that show field errors.
    field_errors: list[dict[str, Any]] | None = None
    # True when the action raised something other than ActionError: ``error`` is then the raw
    # exception text, which may carry anything (a path, a DSN). A driver shows its callers a
    # stable message instead, and keeps the text for the server's log and the admin.
    unexpected: bool = field(default=False, compare=False)


Outcome: TypeAlias = Completed | Interrupted | Failed


def field_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors reduced to what is JSON and useful to a caller: where, what, why."""
    return [
        {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
        for error in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def describe_errors(errors: list[dict[str, Any]], whole: str = "input") -> str:
    """Field errors on one line: ``amount: must be > 0; ticket: required`` (``whole`` names a
    value that is wrong as a whole)."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or whole}: {e['msg']}" for e in errors)


def _run_coroutine(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    # Called from inside an event loop (an async consumer): run the action on its own loop
    # in a helper thread rather than blocking or re-entering the caller's loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


def invoke(
    act: Action | str,
    input: Any,  # noqa: A002
    resumption: ActionResumption | None = None,
    *,
    run_id: int | None = None,
) -> Outcome:
    """Run an action once and say how it ended. Never raises for anything the action does."""
    if isinstance(act, str):
        act = registry.get(act)
    try:
        validated = act.input_model.model_validate(input)
    except ValidationError as exc:
        errors = field_errors(exc)
        return Failed(f"invalid input: {describe_errors(errors)}", field_errors=errors)

    ctx = ActionContext(input=validated, resumption=resumption, run_id=run_id)
    try:
        result = act.execute(ctx)
        if inspect.isawaitable(result):
            result = _run_coroutine(result)
    except ActionInterrupt as interrupt:
        return Interrupted(interrupt.message, interrupt.data, interrupt.state)
    except ActionError as exc:
        return Failed(str(exc))
    except Exception as exc:
        return Failed(f"{type(exc).__name__}: {exc}", unexpected=True)

    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    if problem := json_problem(result, "output"):
        return Failed(f"the action's output must be JSON-serialisable: {problem}")
    # Round-trip through JSON so what the caller sees now is what the database will return.
    return Completed(json.loads(json.dumps(result)))
