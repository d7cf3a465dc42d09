"""The driver port: what a driver is to the engine, what the engine gives and takes at each
step, and the registry the engine finds a run's driver in.

The engine runs a step by calling ``driver.step(run, answers)``: ``answers`` holds the
decisions of the run's pauses, by the call each was given for, the same way for every driver;
the driver asks it for the call it is about to make. The step returns a ``StepResult``: how it
ended, and the driver's new state (an agent's conversation, a script's call log), which the
engine stores with the result in one change. A driver changes no run or interrupt itself.
The one row it may write is the ``error`` event of an unexpected exception inside one of its
calls (an agent's tool, a script's call: ``engine.public_error``), written at once so that the
id a caller is shown can be looked up even if the step's result is then lost; an unexpected
error of the step as a whole is returned (``StepResult.internal``) for the engine to report.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from actions.core import ActionResumption, Completed, Failed, Interrupted, invoke
from actions.models import Run


def arguments_hash(arguments: Any) -> str:
    """The SHA-256 of the arguments' canonical JSON: equal for equal values, whatever the
    order of their keys or spacing."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def call_binding(
    action: str, arguments: Any = None, *, turn: int | None = None, position: int | None = None
) -> dict[str, Any]:
    """What an approval is bound to: the call it was shown for, and no other.

    A driver passes what identifies its calls (an agent: the turn and position of the tool
    call; a script: the position in its call log) and the arguments; a plain action, its name
    only (each of its steps pauses at most once, and an answer resumes the step after it)."""
    binding: dict[str, Any] = {"action": action}
    if turn is not None:
        binding["turn"] = turn
    if position is not None:
        binding["position"] = position
    if turn is not None or position is not None:
        binding["arguments_sha256"] = arguments_hash(arguments)
    return binding


def _key(binding: dict[str, Any]) -> str:
    return json.dumps(binding, sort_keys=True)


@dataclass(frozen=True)
class Answer:
    """How a pause was decided: approved with an answer (resume the call with ``resumption``),
    or rejected with a reason."""

    approved: bool
    data: Any = None
    state: Any = None
    reason: str = ""
    decided_by: str = ""
    # The arguments the reviewer edited the call to, when they did: the call runs with these.
    arguments: Any = None

    @property
    def resumption(self) -> ActionResumption:
        return ActionResumption(data=self.data, state=self.state)


class Answers:
    """The decisions a step resumes from, by the call each was given for (``call_binding``);
    the latest for a call wins (an action may pause more than once on the same call).

    An answer applies only to the call it was shown for: a call with another binding (another
    turn, position or arguments) finds nothing, runs without it, and pauses again if it asks.
    The engine loads them when a driver first asks, unless it knows the one asked for: the
    decision that has just resumed the run is the latest for its call."""

    def __init__(
        self,
        load: Callable[[], Iterable[tuple[dict[str, Any], Answer]]] | None = None,
        *,
        latest: tuple[dict[str, Any], Answer] | None = None,
    ) -> None:
        self._load = load
        self._latest = (_key(latest[0]), latest[1]) if latest is not None else None
        self._by_call: dict[str, Answer] | None = None if load is not None else {}

    def for_call(self, binding: dict[str, Any]) -> Answer | None:
        key = _key(binding)
        if self._latest is not None and self._latest[0] == key:
            return self._latest[1]
        if self._by_call is None:
            assert self._load is not None
            self._by_call = {_key(bound): answer for bound, answer in self._load()}
        return self._by_call.get(key)

    def resumption_for(self, binding: dict[str, Any]) -> ActionResumption | None:
        """What the call resumes with: the approved answer given for it, or None."""
        answer = self.for_call(binding)
        return answer.resumption if answer is not None and answer.approved else None


NO_ANSWERS = Answers()


@dataclass(frozen=True)
class Pause:
    message: str
    data: Any
    state: Any
    tool_call_id: str = ""
    action: str = ""
    # The call it pauses (call_binding): its answer resumes only a call with the same binding.
    binding: dict[str, Any] = field(default_factory=dict)
    # What the paused call was given, when it is a call inside the run (an agent's tool call, a
    # script's call); a plain action's is its run's input. Rules and grants read it.
    arguments: Any = None
    # The JSON Schema its answer must fit, when the pause brings its own (an approval asked for
    # through the API) rather than its action's answer model.
    answer_schema: dict[str, Any] | None = None
    # What the pause asks of its policy beyond its action's (and its team's): ApprovalPolicy's
    # fields by name (actions.engine.policies.as_requested).
    policy: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """How a step ended, as a driver reports it: output, error, or one or more pauses; and the
    driver's state after the step (None: it has none, or it did not change)."""

    status: str
    output: Any = None
    error: str = ""
    pauses: list[Pause] = field(default_factory=list)
    driver_state: dict[str, Any] | None = None
    # The error is an unexpected exception's text: the engine logs it under an error id and
    # tells callers a stable message naming the id (it may carry a path, a DSN, a key).
    internal: bool = False


class Driver:
    """Runs one step of a run for one consumer (driver_for)."""

    # Whether a rejected pause lets the run go on (an agent's model sees the rejection as the
    # tool's result) or ends it (an action, a script).
    rejection_continues = False

    def step(self, run: Run, answers: Answers) -> StepResult:
        raise NotImplementedError

    def proposed_arguments(self, run: Run, binding: dict[str, Any]) -> Any:
        """The arguments of the call a pause with ``binding`` holds, when a reviewer may edit
        them before approving (an agent's tool call); None when its calls cannot be edited."""
        return None

    def approves_automatically(self, run: Run) -> bool:
        """Whether a rule or a standing grant may approve the pauses of ``run``, where its calls
        are not registered actions (whose policies say): a gateway tool's policy may forbid it."""
        return True

    def arguments_schema(self, run: Run) -> dict[str, Any] | None:
        """The JSON Schema an edit of a call of ``run`` must fit, for a driver whose calls are
        not registered actions (a tool of an upstream MCP server); None for a driver whose calls
        are (their input models say)."""
        return None


class ActionDriver(Driver):
    """The plain-action driver: a run of one registered action, from the API or the dashboard.

    Each step runs the action from the top; a step after a pause resumes it with the answer
    that was given for it. An action pauses at most once per step, so its pauses are bound by
    the action's name alone (call_binding)."""

    def step(self, run: Run, answers: Answers) -> StepResult:
        binding = call_binding(run.action)
        outcome = invoke(run.action, run.input, answers.resumption_for(binding), run_id=run.pk)
        if isinstance(outcome, Completed):
            return StepResult(Run.Status.COMPLETED, output=outcome.output)
        if isinstance(outcome, Interrupted):
            pause = Pause(outcome.message, outcome.data, outcome.state, action=run.action, binding=binding)
            return StepResult(Run.Status.INTERRUPTED, pauses=[pause])
        assert isinstance(outcome, Failed)
        return StepResult(Run.Status.FAILED, error=outcome.error, internal=outcome.unexpected)


# The registry: runs of a registered consumer (an agent, a script, a service's approval) are
# stepped by its driver (actions.drivers, registered by the app's ready()); every other runs
# a plain action.
_DRIVERS: dict[str, Driver] = {}
_ACTION = ActionDriver()


def register(consumer: str, driver: Driver) -> None:
    _DRIVERS[consumer] = driver


def driver_for(consumer: str) -> Driver:
    return _DRIVERS.get(consumer, _ACTION)


def runs_an_action(consumer: str) -> bool:
    """Whether the run's ``action`` names a registered action (its input is validated by it),
    rather than a driver's own kind of run (an agent, a script)."""
    return consumer not in _DRIVERS
