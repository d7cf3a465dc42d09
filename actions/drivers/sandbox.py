"""The sandbox consumer: scripts that compose actions, paused and replayed from their call log.

A script is a short Python program: it reads ``input``, calls actions through ``tools.<name>(...)``
or ``call(name, {...})``, and ``return``s a value. It runs in a child process under RestrictedPython
with CPU, memory and wall-time limits (actions/drivers/sandbox_child.py); the actions it calls run here, in
the trusted process.

Every call is logged: position, action, input, result. When a call pauses, the script is stopped
and :class:`SandboxInterrupt` carries the log. Resuming runs the script again from the top: calls
before the paused position return their logged result without running anything, the paused call
runs its action again with the answer, and later calls run live. A script that calls something
else at a logged position has diverged, and the run fails saying where and how.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from pydantic import BaseModel

from actions import engine
from actions.core import (
    MAX_NESTING,
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
from actions.drivers.sandbox_child import NICENESS
from actions.engine.driving import Answers, Driver, Pause, StepResult, call_binding
from actions.models import Run

logger = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("sandbox_child.py")
NICE = shutil.which("nice", path="/usr/bin:/bin")
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


class SandboxUnavailable(engine.EngineError):
    """Scripts are refused: the OS sandbox cannot start here, and no weaker mode was chosen."""


def _restricted_python_dir() -> str:
    import RestrictedPython  # noqa: PLC0415 (loaded only where scripts run)

    return str(Path(RestrictedPython.__file__).resolve().parent)


SITE = "/sandbox/site"
CHILD_IN_SANDBOX = "/sandbox/child.py"


def bwrap_command(python: str) -> list[str]:
    """bubblewrap around the child: new user, PID, network, IPC, UTS and mount namespaces, as
    nobody, and no more of them (--disable-userns). It sees, read-only, the system's libraries,
    the interpreter and RestrictedPython, and nothing else: no project files or database, no
    /etc, /home, /root or /usr/local, no parent environment, no network (its namespace has no
    interface up), no other process. Its root is read-only too, and it dies with its parent."""
    prefix = Path(sys.base_prefix).resolve()
    command = [
        settings.GRUNDLAG_BWRAP,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--uid", "65534",
        "--gid", "65534",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
    ]  # fmt: skip
    # The shared libraries the interpreter links (and the loader), wherever the system keeps them.
    for libs in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32"):
        if Path(libs).is_dir() and not Path(libs).is_symlink():
            command += ["--ro-bind", libs, libs]
    for link in ("lib", "lib64", "lib32", "libx32"):
        top = Path("/") / link
        if top.is_symlink():
            command += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            command += ["--ro-bind", str(top), str(top)]
    if prefix == Path("/usr"):
        command += ["--ro-bind", python, python]  # the standard library is under /usr/lib
    else:
        command += ["--ro-bind", str(prefix), str(prefix)]
    command += [
        "--ro-bind", str(CHILD), CHILD_IN_SANDBOX,
        "--ro-bind", _restricted_python_dir(), f"{SITE}/RestrictedPython",
        "--proc", "/proc",
        "--dev", "/dev",
        "--remount-ro", "/",
        "--chdir", "/",
        python,
    ]  # fmt: skip
    return command


def _interpreter() -> str:
    # The virtualenv's python is a link into a folder the sandbox does not show: use its target.
    return str(Path(sys.executable).resolve())


@functools.cache
def _bwrap_problem() -> str:
    """Why bubblewrap cannot run the child here, or "" when it can. Asked once per process."""
    try:
        probe = subprocess.run(
            [*bwrap_command(_interpreter()), "-I", "-c", "pass"],
            capture_output=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
        )
    except FileNotFoundError:
        return f"{settings.GRUNDLAG_BWRAP} is not installed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{settings.GRUNDLAG_BWRAP} failed to start: {exc}"
    if probe.returncode != 0:
        return f"{settings.GRUNDLAG_BWRAP} failed: {probe.stderr.decode(errors='replace').strip()[:300]}"
    return ""


def check_isolation() -> None:
    """Raise SandboxUnavailable when scripts may not run here; warn in the weaker mode."""
    if settings.GRUNDLAG_SANDBOX_ISOLATION == "none":
        logger.warning(
            "GRUNDLAG_SANDBOX_ISOLATION=none: scripts run WITHOUT the OS sandbox "
            "(language guards, resource limits and a seccomp filter only)"
        )
        return
    if problem := _bwrap_problem():
        raise SandboxUnavailable(
            f"scripts are disabled: the OS sandbox cannot start ({problem}). Install Debian's "
            "bubblewrap package, or set GRUNDLAG_SANDBOX_ISOLATION=none to accept a weaker sandbox"
        )


class _Child:
    """The script's process, and the time it has used (the actions' time is not its own).

    Every read has the wall-time deadline: at the deadline the child is killed, whatever it
    writes or withholds (half a line, then silence, holds no thread)."""

    def __init__(self, *, raw_for_tests: bool = False) -> None:
        check_isolation()
        flags = ["--raw-for-tests"] if raw_for_tests else []
        if settings.GRUNDLAG_SANDBOX_ISOLATION == "bwrap":
            argv = [*bwrap_command(_interpreter()), "-I", CHILD_IN_SANDBOX, SITE, *flags]
        else:
            argv = [sys.executable, "-I", str(CHILD), str(Path(_restricted_python_dir()).parent), *flags]
        # At the script's niceness from its first instruction: its interpreter's start and its
        # compile come after the server's work too (sandbox_child._limit keeps it there).
        if NICE is not None:  # without it, the child nices itself once it has started
            argv = [NICE, "-n", str(NICENESS), *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        self.deadline = time.monotonic() + float(settings.GRUNDLAG_SANDBOX_WALL_SECONDS)
        self.paused_at: float | None = None
        self.buffer = b""
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        assert self.proc.stdin is not None
        self.in_fd = self.proc.stdin.fileno()
        os.set_blocking(self.in_fd, False)
        self.writer = selectors.DefaultSelector()
        self.writer.register(self.in_fd, selectors.EVENT_WRITE)

    def pause_clock(self) -> None:
        """An action runs for the script: its time is not the script's."""
        self.paused_at = time.monotonic()

    def resume_clock(self) -> None:
        if self.paused_at is not None:
            self.deadline += time.monotonic() - self.paused_at
            self.paused_at = None

    def send(self, message: dict[str, Any]) -> None:
        """Write one message, under the same deadline as every read: a child that stops
        reading cannot hold the worker on a full pipe."""
        data = (json.dumps(message) + "\n").encode()
        while data:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not self.writer.select(timeout=remaining):
                self.kill()
                raise ScriptError(
                    f"the script exceeded its wall time ({settings.GRUNDLAG_SANDBOX_WALL_SECONDS} s)", []
                )
            try:
                written = os.write(self.in_fd, data)
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                return  # it died; receive() says why
            data = data[written:]

    def _line(self, call_log: list[dict[str, Any]]) -> bytes:
        limit = settings.GRUNDLAG_MAX_PAYLOAD_BYTES * 2
        while b"\n" not in self.buffer:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(timeout=remaining):
                self.kill()
                raise ScriptError(
                    f"the script exceeded its wall time ({settings.GRUNDLAG_SANDBOX_WALL_SECONDS} s)",
                    call_log,
                )
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return b""  # it exited
            self.buffer += chunk
            if len(self.buffer) > limit and b"\n" not in self.buffer:
                self.kill()
                raise ScriptError(f"the script's process sent a message over {limit} bytes", call_log)
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def receive(self, call_log: list[dict[str, Any]]) -> dict[str, Any]:
        line = self._line(call_log)
        if not line:
            code = self.proc.wait()
            # Killed by a signal: -N from a plain child, 128 + N as bubblewrap reports it.
            if code > 128:
                code = -(code - 128)
            if code == -signal.SIGXCPU or code == -signal.SIGKILL:
                raise ScriptError(
                    f"the script exceeded its CPU time ({settings.GRUNDLAG_SANDBOX_CPU_SECONDS} s)", call_log
                )
            if code == -signal.SIGXFSZ:
                raise ScriptError("the script tried to write a file", call_log)
            raise ScriptError(f"the script's process died (exit {code})", call_log)
        if json_nesting(line) > MAX_NESTING + 2:  # + the message and its call's input object
            raise ScriptError(f"the script sent a value nested deeper than {MAX_NESTING} levels", call_log)
        try:
            message = json.loads(line, parse_constant=_refuse_constant)
        except ValueError:
            raise ScriptError("the script's process sent something unreadable", call_log) from None
        if not isinstance(message, dict):
            raise ScriptError("the script's process sent something unreadable", call_log)
        return message

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for selector in (self.selector, self.writer):
            if selector.get_map() is not None:
                selector.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_JSON_BRACKETS = re.compile(rb"[\[\]{}]")


def json_nesting(text: bytes) -> int:
    """How deeply a JSON text nests, read without parsing it: decoding a value nested a
    thousand deep would exhaust the reader's stack before any limit could be applied."""
    deepest = depth = 0
    for bracket in _JSON_BRACKETS.findall(_JSON_STRINGS.sub(b"", text)):
        depth += 1 if bracket in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def run_raw_for_tests(code: str) -> Any:
    """Run plain Python (not a script) in the sandbox's child, after its limits and filter, to
    show what the OS layer holds back on its own. Only tests call this; nothing routes a
    request or a script to it. ``result`` in the code's namespace is returned."""
    child = _Child(raw_for_tests=True)
    try:
        child.send(
            {
                "raw": code,
                "cpu_seconds": settings.GRUNDLAG_SANDBOX_CPU_SECONDS,
                "memory_bytes": settings.GRUNDLAG_SANDBOX_MEMORY_BYTES,
            }
        )
        message = child.receive([])
        if "error" in message:
            raise ScriptError(message["error"], [])
        return message.get("return")
    finally:
        child.kill()


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
    log_bytes = 0
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
                _check_stored("the script's output", message["return"], log)
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
            if position >= settings.GRUNDLAG_SANDBOX_MAX_CALLS:
                raise ScriptError(
                    f"the script made more than {settings.GRUNDLAG_SANDBOX_MAX_CALLS} action calls "
                    "(GRUNDLAG_SANDBOX_MAX_CALLS)",
                    log,
                )
            _check_stored(f"the input of call {position} ({name})", arguments, log)
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
                child.pause_clock()
                try:
                    entry = _call(name, arguments, this_resumption, run_id, log, position)
                finally:
                    child.resume_clock()
                if "result" in entry:
                    try:
                        engine.check_size(f"the result of call {position} ({name})", entry["result"])
                    except engine.EngineError as exc:
                        entry = {key: value for key, value in entry.items() if key != "result"}
                        entry["error"] = str(exc)
            log_bytes += len(json.dumps(entry, ensure_ascii=False).encode())
            if log_bytes > settings.GRUNDLAG_SANDBOX_MAX_LOG_BYTES:
                raise ScriptError(
                    f"the script's call log grew over {settings.GRUNDLAG_SANDBOX_MAX_LOG_BYTES} bytes "
                    "(GRUNDLAG_SANDBOX_MAX_LOG_BYTES)",
                    log,
                )
            log.append(entry)
            child.send({"failed": entry["error"]} if "error" in entry else {"result": entry["result"]})
    finally:
        child.kill()


def _check_stored(what: str, value: Any, log: list[dict[str, Any]]) -> None:
    """What a script hands over is stored and shown: the same size and nesting limits as an
    answer or an input, so that no page fails to render it."""
    try:
        engine.check_size(what, value)
    except engine.EngineError as exc:
        raise ScriptError(str(exc), log) from None


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
    return {**entry, "error": engine.public_error(run_id, outcome)}


def start_script(source: str, input: Any, team: Any, by: Any) -> Run:  # noqa: A002
    """Queue a script's run. Raises SandboxUnavailable (nothing queued) where scripts may not run."""
    check_isolation()
    state = {"source": source, "input": input, "call_log": [], "paused": None}
    return engine.start_run(
        SCRIPT_ACTION, {"source": source, "input": input}, team, by, Run.Consumer.SANDBOX, driver_state=state
    )


def _binding(paused: dict[str, Any]) -> dict[str, Any]:
    """What the answer to a paused call is bound to: its position, action and arguments."""
    return call_binding(paused["action"], paused["input"], position=paused["position"])


class SandboxDriver(Driver):
    def step(self, run: Run, answers: Answers) -> StepResult:
        state = run.driver_state
        paused = state.get("paused")
        resumption = answers.resumption_for(_binding(paused)) if paused else None
        try:
            output, call_log = run_script(
                state["source"], state["input"], state["call_log"], paused, resumption, run.pk
            )
        except SandboxInterrupt as pause:
            pause_of = Pause(
                pause.message,
                pause.data,
                pause.state,
                action=pause.action,
                binding=_binding(pause.paused),
                arguments=pause.paused["input"],
            )
            return StepResult(
                Run.Status.INTERRUPTED,
                pauses=[pause_of],
                driver_state={**state, "call_log": pause.call_log, "paused": pause.paused},
            )
        except ScriptError as exc:
            return StepResult(
                Run.Status.FAILED,
                error=str(exc),
                driver_state={**state, "call_log": exc.call_log, "paused": None},
            )
        return StepResult(
            Run.Status.COMPLETED, output=output, driver_state={**state, "call_log": call_log, "paused": None}
        )


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
