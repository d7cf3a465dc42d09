"""The sandbox's child process: runs one untrusted script under RestrictedPython.

Started by actions/drivers/sandbox.py as ``python -I sandbox_child.py SITE [--raw-for-tests]``, inside
bubblewrap (actions/drivers/sandbox.py says what it can see) or, in the explicitly weaker mode, as a
plain child process. It imports what scripts may use, then closes itself in before it touches
the script: resource limits, and a seccomp filter that refuses new processes, programs, sockets
and signals. The only way out is the bridge: each action call is a JSON line on stdout,
answered by a JSON line on stdin from the trusted parent, which runs the action itself.

Two layers keep a script in:
- the language: RestrictedPython compiles it (no names or attributes starting with ``_``, no
  frame, code or generator internals), and everything a script can reach is chosen here: the
  allowed modules are stand-ins that carry only the functions and types listed below, never a
  module object, and any attribute whose value is a module, frame, code object or traceback is
  refused;
- the operating system, for the case the first fails: the filter below, the limits, and (in the
  default mode) bubblewrap's namespaces.
"""

from __future__ import annotations

import ctypes
import errno
import json
import operator
import os
import platform
import resource
import struct
import sys
import types
from collections.abc import Callable
from typing import Any

# What a script may import, and of each module exactly these names. Nothing else of a module is
# reachable: the real modules carry their own imports (``datetime.sys``, ``re.enum.sys``,
# ``json.codecs.builtins``) and a formatter that reads any attribute (``string.Formatter``).
ALLOWED: dict[str, tuple[str, ...]] = {
    "math": (
        "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "comb",
        "copysign", "cos", "cosh", "degrees", "dist", "e", "erf", "erfc", "exp", "exp2", "expm1",
        "fabs", "factorial", "floor", "fmod", "frexp", "fsum", "gamma", "gcd", "hypot", "inf",
        "isclose", "isfinite", "isinf", "isnan", "isqrt", "lcm", "ldexp", "lgamma", "log",
        "log10", "log1p", "log2", "modf", "nan", "nextafter", "perm", "pi", "pow", "prod",
        "radians", "remainder", "sin", "sinh", "sqrt", "tan", "tanh", "tau", "trunc", "ulp",
    ),
    "json": ("dumps", "loads", "JSONDecodeError"),
    "re": (
        "compile", "escape", "findall", "finditer", "fullmatch", "match", "search", "split",
        "sub", "subn", "error", "A", "ASCII", "I", "IGNORECASE", "M", "MULTILINE", "S",
        "DOTALL", "X", "VERBOSE",
    ),
    "datetime": ("date", "datetime", "time", "timedelta", "timezone", "MINYEAR", "MAXYEAR"),
    "decimal": (
        "Decimal", "DecimalException", "DivisionByZero", "InvalidOperation", "Overflow",
        "ROUND_05UP", "ROUND_CEILING", "ROUND_DOWN", "ROUND_FLOOR", "ROUND_HALF_DOWN",
        "ROUND_HALF_EVEN", "ROUND_HALF_UP", "ROUND_UP", "getcontext", "localcontext",
    ),
    "statistics": (
        "StatisticsError", "NormalDist", "correlation", "covariance", "fmean", "geometric_mean",
        "harmonic_mean", "linear_regression", "mean", "median", "median_grouped", "median_high",
        "median_low", "mode", "multimode", "pstdev", "pvariance", "quantiles", "stdev", "variance",
    ),
    "itertools": (
        "accumulate", "chain", "combinations", "combinations_with_replacement", "compress",
        "count", "cycle", "dropwhile", "filterfalse", "groupby", "islice", "pairwise",
        "permutations", "product", "repeat", "starmap", "takewhile", "tee", "zip_longest",
    ),
    "string": (
        "ascii_letters", "ascii_lowercase", "ascii_uppercase", "capwords", "digits", "hexdigits",
        "octdigits", "printable", "punctuation", "whitespace",
    ),
    "random": (
        "choice", "choices", "gauss", "randint", "random", "randrange", "sample", "seed",
        "shuffle", "uniform",
    ),
}  # fmt: skip
ALLOWED_MODULES = frozenset(ALLOWED)
MAX_ERROR_CHARS = 4000

# Values no attribute may lead to: each is a way back to real modules, globals or builtins.
LEADS_OUT = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)


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


def script_module(name: str, real: Any) -> Any:
    """A stand-in for module ``name`` that carries only its allowed names. The names live in
    a closure, which a script cannot reach (``__closure__`` starts with an underscore)."""
    names: dict[str, Any] = {}
    for attr in ALLOWED[name]:
        value = getattr(real, attr, None)
        if value is None or isinstance(value, LEADS_OUT):
            continue
        names[attr] = value

    class Module:
        __slots__ = ()

        def __getattr__(self, attr: str) -> Any:
            try:
                return names[attr]
            except KeyError:
                raise AttributeError(f"{name}.{attr} is not available to scripts") from None

        def __dir__(self) -> list[str]:
            return sorted(names)

        def __repr__(self) -> str:
            return f"<module {name!r} for scripts>"

    Module.__name__ = Module.__qualname__ = f"{name} (for scripts)"
    return Module()


# Resource limits and the system calls a script's process may never make.

NOBODY = 65534
# A script's CPU comes after the server's: a team's CPU-bound scripts slow its own scripts, not
# every team's requests and steps (the web process and the workers run at the default, 0).
NICENESS = 10


def _limit(cpu_seconds: int, memory_bytes: int) -> None:
    os.nice(max(0, NICENESS - os.nice(0)))  # started under `nice` by the server; at least this
    if os.geteuid() == 0:
        # Were the script to get past every other guard, it is nobody (the weaker mode, as root).
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# Per architecture: the audit arch seccomp reports, and the numbers of the calls refused: new
# processes and programs; sockets, also through io_uring; signals and memory access to other
# processes; namespaces, mounts, BPF, keys and the other ways into the kernel's rarer code.
SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "socket": 41, "connect": 42, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58,
            "execve": 59, "kill": 62, "ptrace": 101, "rt_sigqueueinfo": 129, "mount": 165,
            "umount2": 166, "tkill": 200, "tgkill": 234, "add_key": 248, "request_key": 249,
            "keyctl": 250, "unshare": 272, "rt_tgsigqueueinfo": 297, "perf_event_open": 298,
            "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
            "execveat": 322, "userfaultfd": 323, "pidfd_send_signal": 424, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "pidfd_open": 434, "clone3": 435,
            "pidfd_getfd": 438,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "umount2": 39, "mount": 40, "unshare": 97, "kill": 129, "tkill": 130, "tgkill": 131,
            "rt_sigqueueinfo": 138, "socket": 198, "socketpair": 199, "connect": 203,
            "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "execve": 221,
            "rt_tgsigqueueinfo": 240, "perf_event_open": 241, "setns": 268,
            "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "execveat": 281,
            "userfaultfd": 282, "ptrace": 117, "pidfd_send_signal": 424, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "pidfd_open": 434, "clone3": 435,
            "pidfd_getfd": 438,
        },
    ),
}  # fmt: skip
X32_SYSCALL_BIT = 0x40000000


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def seccomp_program(machine: str) -> bytes:
    """A classic BPF program for seccomp: the refused calls fail with EPERM, a foreign
    architecture (or x32 on x86_64) kills the process, everything else is allowed."""
    arch, numbers = SYSCALLS[machine]
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
    refused = sorted(set(numbers.values()))
    program = [(ld_abs, 0, 0, 4)]  # seccomp_data.arch
    # Instructions after the next: one load, the x32 check, one test per call, then three returns.
    after = 1 + 1 + len(refused)
    program.append((jeq, 0, after + 2, arch))  # not ours: kill
    program.append((ld_abs, 0, 0, 0))  # seccomp_data.nr
    program.append((jge, len(refused) + 1, 0, X32_SYSCALL_BIT))  # x32 calls: refuse
    for index, number in enumerate(refused):
        program.append((jeq, len(refused) - index, 0, number))
    program += [(ret, 0, 0, allow), (ret, 0, 0, eperm), (ret, 0, 0, kill)]
    return b"".join(struct.pack("HBBI", *instruction) for instruction in program)


def _refuse_system_calls() -> bool:
    """Install the seccomp filter (for good: it cannot be lifted). False where the platform
    has none (then the OS sandbox, or its absence, is all there is)."""
    machine = platform.machine()
    if machine not in SYSCALLS or not sys.platform.startswith("linux"):
        return False
    program = seccomp_program(machine)
    libc = ctypes.CDLL(None, use_errno=True)
    fprog = _SockFprog(len(program) // 8, program)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True


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

    __slots__ = ()

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


def main() -> None:
    site, raw_allowed = sys.argv[1], "--raw-for-tests" in sys.argv[2:]
    # Only RestrictedPython, from the one folder the parent bound in: nothing else of its
    # virtualenv (or the project) is visible here.
    sys.path.insert(0, site)
    job = _receive()
    # Everything the script needs is imported before the limits close in.
    from RestrictedPython import (
        compile_restricted_function,
        limited_builtins,
        safe_builtins,
    )
    from RestrictedPython.Eval import default_guarded_getitem, default_guarded_getiter
    from RestrictedPython.Guards import (
        full_write_guard,
        guarded_iter_unpack_sequence,
        guarded_unpack_sequence,
        safer_getattr_raise,
    )
    from RestrictedPython.PrintCollector import PrintCollector

    modules = {name: script_module(name, __import__(name)) for name in ALLOWED}
    _limit(job["cpu_seconds"], job["memory_bytes"])
    filtered = _refuse_system_calls()

    if "raw" in job:
        # Tests only (the parent passes the flag from sandbox.run_raw_for_tests, never for a
        # script): plain Python, to show what the OS layer alone holds back.
        if not raw_allowed:
            _send({"error": "raw code is not accepted"})
            return
        namespace: dict[str, Any] = {"seccomp": filtered}
        try:
            exec(job["raw"], namespace)  # noqa: S102 - the test hook, see above
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            _send({"return": {"raised": f"{type(exc).__name__}: {exc}"}})
            return
        _send({"return": namespace.get("result")})
        return

    missing = object()

    def guarded_getattr(obj: Any, name: str, default: Any = missing) -> Any:
        """``obj.name`` and ``getattr(obj, name[, default])``: RestrictedPython's checks, then
        none of the values that lead out. A missing attribute raises, as in Python."""
        if isinstance(obj, types.ModuleType):
            raise AttributeError(f"{name!r} is not available to scripts")
        try:
            value = safer_getattr_raise(obj, name)  # type: ignore[no-untyped-call]
        except AttributeError:
            if default is missing:
                raise
            return default
        if isinstance(value, LEADS_OUT):
            raise AttributeError(f"{name!r} is not available to scripts")
        return value

    def guarded_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name not in modules:
            raise ImportError(
                f"import of {name!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
            )
        return modules[name]

    compiled = compile_restricted_function("tools, call, input", job["source"], "script")
    if compiled.errors or compiled.code is None:
        _send({"error": "the script does not compile: " + "; ".join(compiled.errors)})
        return
    builtins = {**safe_builtins, **limited_builtins}
    builtins.update(
        __import__=guarded_import,
        getattr=guarded_getattr,
        ActionFailed=ActionFailed,
        set=set,
        frozenset=frozenset,
        # Scripts written against RestrictedPython's utility builtins find these by name.
        math=modules["math"],
        string=modules["string"],
        random=modules["random"],
    )
    real = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)
    for name in ("sum", "min", "max", "any", "all", "enumerate", "sorted", "reversed", "map", "filter"):
        builtins.setdefault(name, real[name])
    builtins.setdefault("dict", dict)
    builtins.setdefault("list", list)
    namespace = {
        "__builtins__": builtins,
        "_getattr_": guarded_getattr,
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
    except Exception as exc:  # the script's own error, reported as the run's
        _send({"error": f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]})
        return
    _send({"return": result})


if __name__ == "__main__":
    main()
