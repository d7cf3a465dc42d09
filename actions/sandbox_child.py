"""The sandbox's child process: runs one untrusted script under RestrictedPython.

Started as ``python -I sandbox_child.py``: isolated mode, nothing from the environment, only the
standard library and RestrictedPython. It limits its own CPU time, memory and file writes before
it touches the script. The only way out is the bridge: each action call is a JSON line on stdout,
answered by a JSON line on stdin from the trusted parent, which runs the action itself.
"""

from __future__ import annotations

import json
import operator
import os
import resource
import sys
from collections.abc import Callable
from typing import Any

ALLOWED_MODULES = frozenset(
    {"math", "json", "re", "datetime", "decimal", "statistics", "itertools", "string"}
)


class ActionFailed(Exception):
    """Raised inside the script when an action it called failed."""


def _send(message: dict[str, Any]) -> None:
    sys.__stdout__.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
    sys.__stdout__.flush()  # type: ignore[union-attr]


def _receive() -> dict[str, Any]:
    line = sys.__stdin__.readline()  # type: ignore[union-attr]
    if not line:
        raise SystemExit(0)
    result: dict[str, Any] = json.loads(line)
    return result


NOBODY = 65534


def _limit(cpu_seconds: int, memory_bytes: int) -> None:
    if os.geteuid() == 0:
        # Defence in depth: were the script to get past RestrictedPython, it is nobody.
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def call(name: Any, arguments: Any = None) -> Any:
    if not isinstance(name, str):
        raise TypeError("call(name, input): name must be an action name")
    arguments = {} if arguments is None else arguments
    try:
        json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the input of {name} must be JSON: {exc}") from None
    _send({"call": name, "input": arguments})
    reply = _receive()
    if "failed" in reply:
        raise ActionFailed(reply["failed"])
    return reply["result"]


class Tools:
    """``tools.send_invoice(invoice_id="A-1", amount=10)`` is ``call("send_invoice", {...})``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda **arguments: call(name, arguments)


_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "|=": operator.ior,
    "&=": operator.iand, "^=": operator.ixor,
}  # fmt: skip


def _inplacevar(op: str, target: Any, value: Any) -> Any:
    if op not in _INPLACE:
        raise SyntaxError(f"{op} is not allowed")
    return _INPLACE[op](target, value)


def _guarded_import(name: str, *args: Any, **kwargs: Any) -> Any:
    if name not in ALLOWED_MODULES:
        raise ImportError(
            f"import of {name!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
        )
    return __import__(name, *args, **kwargs)


def main() -> None:
    job = _receive()
    # Everything the script needs is imported before the limits close in.
    from RestrictedPython import (
        compile_restricted_function,
        limited_builtins,
        safe_builtins,
        utility_builtins,
    )
    from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
    from RestrictedPython.Guards import (
        full_write_guard,
        guarded_iter_unpack_sequence,
        guarded_unpack_sequence,
        safer_getattr,
    )
    from RestrictedPython.PrintCollector import PrintCollector

    for module in ALLOWED_MODULES:
        __import__(module)
    _limit(job["cpu_seconds"], job["memory_bytes"])

    compiled = compile_restricted_function("tools, call, input", job["source"], "script")
    if compiled.errors or compiled.code is None:
        _send({"error": "the script does not compile: " + "; ".join(compiled.errors)})
        return
    builtins = {**safe_builtins, **limited_builtins, **utility_builtins}
    builtins.update(__import__=_guarded_import, getattr=safer_getattr, ActionFailed=ActionFailed)
    for name in (
        "sum",
        "min",
        "max",
        "any",
        "all",
        "enumerate",
        "sorted",
        "reversed",
        "map",
        "filter",
        "dict",
        "list",
    ):
        builtins.setdefault(
            name, __builtins__[name] if isinstance(__builtins__, dict) else getattr(__builtins__, name)
        )
    namespace: dict[str, Any] = {
        "__builtins__": builtins,
        "_getattr_": safer_getattr,
        "_getitem_": default_guarded_getitem,
        "_getiter_": default_guarded_getiter,
        "_write_": full_write_guard,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_inplacevar_": _inplacevar,
        "_print_": PrintCollector,
        "_apply_": lambda f, *a, **kw: f(*a, **kw),
    }
    try:
        exec(compiled.code, namespace)  # noqa: S102 - compiled by RestrictedPython, guarded above
        result = namespace["script"](Tools(), call, job["input"])
        json.dumps(result, allow_nan=False)
    except MemoryError:
        _send({"error": "the script ran out of memory"})
        return
    except RecursionError:
        _send({"error": "the script recursed too deeply"})
        return
    except (TypeError, ValueError) as exc:
        _send({"error": f"{type(exc).__name__}: {exc}"})
        return
    except Exception as exc:  # the script's own error, reported as the run's
        _send({"error": f"{type(exc).__name__}: {exc}"})
        return
    _send({"return": result})


if __name__ == "__main__":
    main()
