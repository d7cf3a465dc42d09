"""The sandbox consumer: scripts that compose actions, paused and replayed from their call log.

A script is a short Python program: it reads ``input``, calls actions through ``tools.<name>(...)``
or ``call(name, {...})``, and ``return``s a value. It runs in a child process under RestrictedPython
with CPU, memory and wall-time limits (actions/sandbox_child.py); the actions it calls run here, in
the trusted process.

Every call is logged: position, action, input, result. When a call pauses, the script is stopped
and :class:`SandboxInterrupt` carries the log. Resuming runs the script again from the top: calls
before the paused position return their logged result without running anything, the paused call
runs its action again with the answer, and later calls run live. A script that calls something
else at a logged position has diverged, and the run fails saying where and how.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from pydantic import BaseModel

from actions import runner
from actions.core import (
    Action,
    ActionContext,
    ActionError,
    ActionInterrupt,
    ActionResumption,
    Completed,
    Interrupted,
    action,
    invoke,
    registry,
)
from actions.models import Run

CHILD = Path(__file__).with_name("sandbox_child.py")
SCRIPT_ACTION = "script"


class ScriptError(Exception):
    """The script failed: its own error, a limit it hit, or a divergence from its call log."""

    def __init__(self, message: str, call_log: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.call_log = call_log


class SandboxInterrupt(ActionInterrupt):
    """A call inside the script paused. Carries the call log up to it and the paused call."""

    def __init__(
        self,
        inner: Interrupted,
        call_log: list[dict[str, Any]],
        position: int,
        action_name: str,
        input: Any,  # noqa: A002
    ) -> None:
        super().__init__(inner.message, inner.data, inner.state)
        self.call_log = call_log
        self.position = position
        self.action = action_name
        self.input = input

    @property
    def paused(self) -> dict[str, Any]:
        return {"position": self.position, "action": self.action, "input": self.input}


def _describe(name: str, arguments: Any) -> str:
    return f"{name}({json.dumps(arguments, sort_keys=True)})"


class _Child:
    """The script's process, and the time it has used (the actions' time is not its own)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        self.budget = float(settings.GRUNDLAG_SANDBOX_WALL_SECONDS)
        self.selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return  # it died; receive() says why

    def receive(self, call_log: list[dict[str, Any]]) -> dict[str, Any]:
        started = time.monotonic()
        ready = self.selector.select(timeout=max(self.budget, 0))
        self.budget -= time.monotonic() - started
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline(settings.GRUNDLAG_MAX_PAYLOAD_BYTES * 2) if ready else b""
        if not ready:
            raise ScriptError(
                f"the script exceeded its wall time ({settings.GRUNDLAG_SANDBOX_WALL_SECONDS} s)", call_log
            )
        if not line:
            code = self.proc.wait()
            if code == -signal.SIGXCPU or code == -signal.SIGKILL:
                raise ScriptError(
                    f"the script exceeded its CPU time ({settings.GRUNDLAG_SANDBOX_CPU_SECONDS} s)", call_log
                )
            if code == -signal.SIGXFSZ:
                raise ScriptError("the script tried to write a file", call_log)
            raise ScriptError(f"the script's process died (exit {code})", call_log)
        try:
            message: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            raise ScriptError("the script's process sent something unreadable", call_log) from None
        return message

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.selector.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def run_script(
    source: str,
    input: Any,  # noqa: A002
    call_log: list[dict[str, Any]] | None = None,
    paused: dict[str, Any] | None = None,
    resumption: ActionResumption | None = None,
    run_id: int | None = None,
) -> tuple[Any, list[dict[str, Any]]]:
    """Run (or replay) a script. Returns (its return value, the full call log).

    Raises SandboxInterrupt when a call pauses, ScriptError when the script fails."""
    logged = list(call_log or [])
    log: list[dict[str, Any]] = []
    child = _Child()
    try:
        child.send(
            {
                "source": source,
                "input": input,
                "cpu_seconds": settings.GRUNDLAG_SANDBOX_CPU_SECONDS,
                "memory_bytes": settings.GRUNDLAG_SANDBOX_MEMORY_BYTES,
            }
        )
        while True:
            message = child.receive(log)
            if "return" in message:
                if len(log) < len(logged) or paused is not None:
                    expected = logged[len(log)] if len(log) < len(logged) else paused
                    assert expected is not None
                    raise ScriptError(
                        f"the script diverged from its call log at position {len(log)}: expected "
                        f"{_describe(expected['action'], expected['input'])}, but the script returned",
                        log,
                    )
                return message["return"], log
            if "error" in message:
                raise ScriptError(message["error"], log)
            name, arguments = str(message.get("call")), message.get("input")
            position = len(log)
            expected = logged[position] if position < len(logged) else paused
            if expected is not None and (expected["action"], expected["input"]) != (name, arguments):
                raise ScriptError(
                    f"the script diverged from its call log at position {position}: expected "
                    f"{_describe(expected['action'], expected['input'])}, got {_describe(name, arguments)}",
                    log,
                )
            if position < len(logged):
                entry = logged[position]  # replayed: the action does not run again
            else:
                this_resumption = resumption if paused is not None else None
                paused = None
                entry = _call(name, arguments, this_resumption, run_id, log, position)
            log.append(entry)
            child.send({"failed": entry["error"]} if "error" in entry else {"result": entry["result"]})
    finally:
        child.kill()


def _call(
    name: str,
    arguments: Any,
    resumption: ActionResumption | None,
    run_id: int | None,
    log: list[dict[str, Any]],
    position: int,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"position": position, "action": name, "input": arguments}
    if name not in registry:
        return {**entry, "error": f"there is no action named {name!r}"}
    outcome = invoke(name, arguments, resumption, run_id=run_id)
    if isinstance(outcome, Interrupted):
        raise SandboxInterrupt(outcome, log, position, name, arguments)
    if isinstance(outcome, Completed):
        return {**entry, "result": outcome.output}
    return {**entry, "error": runner.public_error(run_id, outcome)}


def start_script(source: str, input: Any, team: Any, by: Any) -> Run:  # noqa: A002
    state = {"source": source, "input": input, "call_log": [], "paused": None}
    return runner.start_run(
        SCRIPT_ACTION, {"source": source, "input": input}, team, by, Run.Consumer.SANDBOX, driver_state=state
    )


def _binding(paused: dict[str, Any]) -> dict[str, Any]:
    """What the answer to a paused call is bound to: its position, action and arguments."""
    return runner.call_binding(paused["action"], paused["input"], position=paused["position"])


class SandboxDriver(runner.Driver):
    def step(self, run: Run) -> runner.StepResult:
        state = run.driver_state
        paused = state.get("paused")
        resumption = runner.last_resumption(run, _binding(paused)) if paused else None
        try:
            output, state["call_log"] = run_script(
                state["source"], state["input"], state["call_log"], paused, resumption, run.pk
            )
        except SandboxInterrupt as pause:
            state["call_log"], state["paused"] = pause.call_log, pause.paused
            pause_of = runner.Pause(
                pause.message, pause.data, pause.state, action=pause.action, binding=_binding(pause.paused)
            )
            return runner.StepResult(Run.Status.INTERRUPTED, pauses=[pause_of])
        except ScriptError as exc:
            state["call_log"], state["paused"] = exc.call_log, None
            return runner.StepResult(Run.Status.FAILED, error=str(exc))
        state["paused"] = None
        return runner.StepResult(Run.Status.COMPLETED, output=output)


runner.DRIVERS[Run.Consumer.SANDBOX] = SandboxDriver()


def script_action(
    name: str,
    source: str,
    *,
    input: type[BaseModel],
    description: str = "",  # noqa: A002
) -> Action:
    """Register a script as an action, so the API or an agent can call it by name.

    The script's call log rides in the action's own checkpoint: the interrupt contract composes,
    and the inner action's pause surfaces in the inbox like any other."""

    def execute(ctx: ActionContext) -> Any:
        checkpoint = ctx.resumption.state if ctx.resumption else None
        inner = (
            ActionResumption(ctx.resumption.data, checkpoint["inner_state"])
            if checkpoint and ctx.resumption
            else None
        )
        try:
            output, _ = run_script(
                source,
                ctx.input.model_dump(mode="json"),
                checkpoint["call_log"] if checkpoint else [],
                checkpoint["paused"] if checkpoint else None,
                inner,
                ctx.run_id,
            )
        except SandboxInterrupt as pause:
            state = {"call_log": pause.call_log, "paused": pause.paused, "inner_state": pause.state}
            raise ActionInterrupt(pause.message, pause.data, state) from None
        except ScriptError as exc:
            raise ActionError(f"script {name}: {exc}") from None
        return output

    execute.__name__ = name
    return action(
        name, input=input, description=description or f"A script: {source.strip().splitlines()[0]}"
    )(execute)
