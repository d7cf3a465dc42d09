"""The sandbox as an attacker with a team's API token meets it: the language guards (what a
script can reach), the OS sandbox on its own (plain Python run in the child through the
test-only hook), a child that withholds its answer, and values built to break pages."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from pydantic import BaseModel

from actions.core import ActionContext, ActionInterrupt, action
from actions.drivers import sandbox
from actions.models import Interrupt, Run, Team

# Slow: each script runs in a child process (make test runs them, make check does not).
pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def run_script_over_api(client: Client, key: str, source: str, **payload: Any) -> dict[str, Any]:
    response = client.post(
        "/api/scripts/runs",
        json.dumps({"source": source, "input": payload}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}", "Prefer": "wait=20"},
    )
    body: dict[str, Any] = response.json()
    return body


# 1. The language level: no module, globals, frame or code object is reachable.

WALKS_OUT = [
    "import datetime\nreturn datetime.sys.modules['os'].getuid()",
    "import statistics\nreturn statistics.sys.modules['os'].listdir('/')",
    "import re\nreturn re.enum.sys.modules['os'].environ",
    "import json\nreturn json.codecs.builtins.eval('1+1')",
    "import json\nreturn json.decoder.scanner",
    "import string\nreturn string.Formatter().format('{0.__globals__}', call)",
    "import datetime\nreturn getattr(datetime, 'sys')",
    "return getattr(math, 'sys')",
    "return string.Formatter",
    "return random.os",
    "g = (x for x in [1])\nreturn getattr(g, 'gi_' + 'frame')",
    "from json import codecs\nreturn codecs",
    "import os.path\nreturn 1",
]


@pytest.mark.parametrize("source", WALKS_OUT)
def test_no_script_reaches_a_module_or_its_globals(client: Client, token_key: str, source: str) -> None:
    run = run_script_over_api(client, token_key, source)
    assert run["status"] == "failed", run
    reasons = ("not available to scripts", "not allowed", "restricted name", "cannot import name")
    assert any(reason in run["error"] for reason in reasons), run["error"]


def test_what_scripts_need_still_works(client: Client, token_key: str) -> None:
    source = """
import datetime, json, math, re, statistics, itertools, string, decimal
from datetime import timedelta
day = datetime.date(2026, 12, 3) + timedelta(days=1)
return {
    "day": day.isoformat(),
    "json": json.loads(json.dumps({"a": [1, 2]})),
    "sqrt": math.sqrt(16),
    "words": re.findall(r"[a-z]+", "ab cd"),
    "mean": statistics.mean([1, 2, 3]),
    "pairs": list(itertools.combinations([1, 2, 3], 2)),
    "digits": string.digits,
    "sum": str(decimal.Decimal("0.1") + decimal.Decimal("0.2")),
}
"""
    run = run_script_over_api(client, token_key, source)
    assert run["status"] == "completed", run
    assert run["output"]["day"] == "2026-12-04" and run["output"]["sum"] == "0.3"
    assert run["output"]["pairs"] == [[1, 2], [1, 3], [2, 3]]


# The OS level, on its own: plain Python in the child, past every language guard.


@pytest.fixture
def bwrap(settings: Any) -> None:
    """The OS sandbox, as by default (CI installs bubblewrap: these run, never skip)."""
    settings.GRUNDLAG_SANDBOX_ISOLATION = "bwrap"


@pytest.mark.usefixtures("bwrap")
def test_the_child_cannot_read_the_database_the_environment_or_shadow(monkeypatch: Any) -> None:
    monkeypatch.setenv("GRUNDLAG_TEST_SECRET", "s3cret-value")
    database = str(connection.settings_dict["NAME"])
    assert os.path.exists(database)
    result = sandbox.run_raw_for_tests(
        f"""
import os
seen = {{}}
for path in [{database!r}, "/etc/shadow", "/etc/passwd", "/proc/1/environ", {os.getcwd()!r}]:
    try:
        with open(path, "rb") as f:
            seen[path] = f.read(64).decode("latin-1")
    except OSError as exc:
        seen[path] = type(exc).__name__
parent = {os.getpid()}
try:
    seen["parent"] = open(f"/proc/{{parent}}/environ", "rb").read().decode("latin-1")
except OSError as exc:
    seen["parent"] = type(exc).__name__
seen["env"] = dict(os.environ)
seen["uid"] = os.getuid()
seen["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
result = seen
"""
    )
    assert result[database] == "FileNotFoundError"
    assert result["/etc/shadow"] == "FileNotFoundError" and result["/etc/passwd"] == "FileNotFoundError"
    assert result[os.getcwd()] == "FileNotFoundError", "no project files"
    assert "s3cret-value" not in json.dumps(result)
    assert result["parent"] == "FileNotFoundError", "the parent is not in its PID namespace"
    assert set(result["env"]) <= {"PATH", "PWD", "LC_CTYPE"}, "nothing of the parent's environment"
    assert result["uid"] == 65534
    assert max(result["pids"]) < 10, "only its own processes"


@pytest.mark.usefixtures("bwrap")
def test_the_child_sees_only_libraries_and_the_interpreter_all_read_only() -> None:
    result = sandbox.run_raw_for_tests(
        """
import os
seen = {"usr": sorted(os.listdir("/usr"))}
for path in ("/etc", "/usr/local", "/usr/bin", "/home", "/tmp"):
    seen[path] = os.path.exists(path)
try:
    os.mkdir("/junk")
    seen["mkdir"] = "made"
except OSError as exc:
    seen["mkdir"] = exc.strerror
result = seen
"""
    )
    assert set(result["usr"]) <= {"lib", "lib64", "lib32", "libx32"}
    assert not any(result[path] for path in ("/etc", "/usr/local", "/usr/bin", "/home", "/tmp"))
    assert result["mkdir"] == "Read-only file system"


@pytest.mark.usefixtures("bwrap")
def test_the_child_reaches_no_socket() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        result = sandbox.run_raw_for_tests(
            f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    result = "connected"
except OSError as exc:
    result = type(exc).__name__ + ": " + str(exc)
"""
        )
    finally:
        server.close()
    assert result != "connected" and "PermissionError" in result, result


def test_the_child_can_neither_fork_nor_run_programs_in_either_mode(settings: Any) -> None:
    for isolation in ("bwrap", "none"):
        settings.GRUNDLAG_SANDBOX_ISOLATION = isolation
        result = sandbox.run_raw_for_tests(
            """
import os
outcome = {}
try:
    outcome["fork"] = os.fork()
    if outcome["fork"] == 0:
        os._exit(0)
except OSError as exc:
    outcome["fork"] = type(exc).__name__
try:
    os.execv("/bin/true", ["/bin/true"])
except OSError as exc:
    outcome["exec"] = type(exc).__name__
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
# Sockets through io_uring, and new namespaces: refused by the filter too (EPERM is 1).
for name, number, args in (("io_uring", 425, (1, 0)), ("unshare", 272, (0x10000000,))):
    outcome[name] = (libc.syscall(number, *args), ctypes.get_errno())
result = outcome
"""
        )
        assert result == {
            "fork": "PermissionError",
            "exec": "PermissionError",
            "io_uring": [-1, 1],
            "unshare": [-1, 1],
        }, (isolation, result)


@pytest.mark.usefixtures("bwrap")
def test_nothing_of_the_child_outlives_it(settings: Any) -> None:
    """Even a child that starts a new session and ignores signals is gone when its time is up."""
    settings.GRUNDLAG_SANDBOX_WALL_SECONDS = 2
    marker = f"grundlag-{uuid.uuid4().hex}"
    started = time.monotonic()
    with pytest.raises(sandbox.ScriptError, match="wall time"):
        sandbox.run_raw_for_tests(
            f"""
import os, signal, time
os.setsid()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
marker = {marker!r}
time.sleep(60)
"""
        )
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert survivors == ""


def test_without_the_os_sandbox_scripts_are_refused_with_a_clear_error(
    client: Client, token_key: str, settings: Any
) -> None:
    settings.GRUNDLAG_BWRAP = "/nonexistent/bwrap"
    sandbox._bwrap_problem.cache_clear()
    try:
        response = client.post(
            "/api/scripts/runs",
            json.dumps({"source": "return 1"}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token_key}"},
        )
        assert response.status_code == 503
        detail = response.json()["detail"]
        assert "scripts are disabled" in detail and "bubblewrap" in detail
        assert "GRUNDLAG_SANDBOX_ISOLATION=none" in detail
        assert not Run.objects.exists(), "nothing was queued"
        settings.GRUNDLAG_SANDBOX_ISOLATION = "none"  # the operator's explicit, logged choice
        run = run_script_over_api(client, token_key, "return 1 + 1")
        assert run["status"] == "completed" and run["output"] == 2
    finally:
        sandbox._bwrap_problem.cache_clear()


# 2. A child that withholds its answer holds no worker past its wall time.


def test_a_child_that_writes_half_a_message_and_sleeps_is_killed_at_the_deadline(settings: Any) -> None:
    settings.GRUNDLAG_SANDBOX_WALL_SECONDS = 2
    started = time.monotonic()
    with pytest.raises(sandbox.ScriptError, match=r"exceeded its wall time \(2 s\)"):
        sandbox.run_raw_for_tests(
            "import sys, time\nsys.stdout.write('{')\nsys.stdout.flush()\ntime.sleep(60)"
        )
    assert time.monotonic() - started < 5


def test_a_child_that_stops_reading_cannot_block_a_write_past_the_deadline(settings: Any) -> None:
    settings.GRUNDLAG_SANDBOX_WALL_SECONDS = 2
    child = sandbox._Child(raw_for_tests=True)
    try:
        child.send({"raw": "import time\ntime.sleep(60)", "cpu_seconds": 5, "memory_bytes": 256 * 2**20})
        started = time.monotonic()
        with pytest.raises(sandbox.ScriptError, match="wall time"):
            child.send({"result": "x" * 1_000_000})  # far more than a pipe holds
        assert time.monotonic() - started < 5
    finally:
        child.kill()


def test_four_stalling_children_do_not_stall_a_fifth(settings: Any) -> None:
    settings.GRUNDLAG_SANDBOX_WALL_SECONDS = 2
    errors: list[str] = []

    def stall() -> None:
        try:
            sandbox.run_raw_for_tests(
                "import sys, time\nsys.stdout.write('{')\nsys.stdout.flush()\ntime.sleep(60)"
            )
        except sandbox.ScriptError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=stall) for _ in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert time.monotonic() - started < 6 and len(errors) == 4
    assert sandbox.run_script("return 2", {})[0] == 2


# 3. Values that break pages, and a script's number of calls.


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_deep_script_output_or_call_input_fails_the_run_naming_the_limit(
    client: Client, token_key: str
) -> None:
    build = "x = []\nfor _ in range(960):\n    x = [x]\n"
    run = run_script_over_api(client, token_key, build + "return x")
    assert run["status"] == "failed" and "nested deeper than 32 levels" in run["error"], run["error"]
    run = run_script_over_api(client, token_key, build + "return tools.noted_sink(value=x)")
    assert run["status"] == "failed" and "nested deeper than 32 levels" in run["error"], run["error"]
    # Just over the limit, the error names what was too deep.
    lists = "x = []\nfor _ in range({}):\n    x = [x]\n"
    run = run_script_over_api(client, token_key, lists.format(32) + "return x")
    assert run["error"] == "the script's output at [0]" + "[0]" * 31 + ": nested deeper than 32 levels"
    run = run_script_over_api(client, token_key, lists.format(31) + "return tools.noted_sink(value=x)")
    assert run["error"].startswith("the input of call 0 (noted_sink) at value[0]")
    assert Run.objects.get(pk=run["id"]).driver_state["call_log"] == []


def test_a_script_may_call_at_most_the_configured_number_of_actions(
    client: Client, token_key: str, settings: Any
) -> None:
    settings.GRUNDLAG_SANDBOX_MAX_CALLS = 5
    run = run_script_over_api(
        client, token_key, "for n in range(50):\n    tools.lookup_customer(customer_id='c')"
    )
    assert run["status"] == "failed"
    assert "more than 5 action calls (GRUNDLAG_SANDBOX_MAX_CALLS)" in run["error"]
    assert len(Run.objects.get(pk=run["id"]).driver_state["call_log"]) == 5


def test_a_deep_value_already_stored_still_renders_everywhere(
    team: Team, reviewer: User, auditor: User, admin_client: Client
) -> None:
    """Stored before the limits existed: every page of the team still answers."""
    run = Run.objects.create(action="send_invoice", team=team, status="interrupted")
    it = Interrupt.objects.create(run=run, seq=1, team=team, action="send_invoice", message="Deep?")
    text = '{"v": ' + deep(960) + "}"
    with connection.cursor() as cursor:  # as it was stored: by SQL, not through json.dumps
        cursor.execute("UPDATE actions_run SET input = %s, output = %s WHERE id = %s", [text, text, run.pk])
        cursor.execute("UPDATE actions_interrupt SET data = %s WHERE id = %s", [text, it.pk])
    member = Client()
    member.force_login(reviewer)
    for page in ("/", f"/interrupts/{it.pk}/", f"/runs/{run.pk}/", "/runs/"):
        response = member.get(page)
        assert response.status_code == 200, page
    detail = member.get(f"/interrupts/{it.pk}/").content.decode()
    assert "too deep to show" in detail
    staff = Client()
    staff.force_login(auditor)
    assert staff.get("/history/").status_code == 200
    for page in (
        "/admin/actions/run/",
        f"/admin/actions/run/{run.pk}/change/",
        "/admin/actions/interrupt/",
        f"/admin/actions/interrupt/{it.pk}/change/",
    ):
        assert admin_client.get(page).status_code == 200, page


class Depth(BaseModel):
    levels: int


@action(input=Depth, name="deep_output")
def deep_output(ctx: ActionContext) -> Any:
    value: Any = []
    for _ in range(ctx.input.levels):
        value = [value]
    if ctx.resumption is None and ctx.input.levels < 0:
        raise ActionInterrupt("never", {})
    return value


def test_an_actions_output_too_deep_to_store_fails_the_run_saying_so(client: Client, token_key: str) -> None:
    def run_with(levels: int) -> dict[str, Any]:
        body = json.dumps({"action": "deep_output", "input": {"levels": levels}})
        headers = {"Authorization": f"Bearer {token_key}", "Prefer": "wait=10"}
        result: dict[str, Any] = client.post(
            "/api/runs", body, content_type="application/json", headers=headers
        ).json()
        return result

    too_deep = run_with(40)
    assert too_deep["status"] == "failed"
    assert too_deep["error"].startswith("the step's result cannot be stored: the output at [0]")
    assert Run.objects.get(pk=too_deep["id"]).output is None
    assert run_with(20)["status"] == "completed"


def test_text_no_database_can_store_is_422_or_escaped_never_a_stuck_run(
    client: Client, token_key: str, team: Team
) -> None:
    headers = {"Authorization": f"Bearer {token_key}", "Prefer": "wait=10"}
    refused = client.post(
        "/api/scripts/runs",
        '{"source": "return 1", "input": {"a": "\\ud800"}}',
        content_type="application/json",
        headers=headers,
    )
    assert refused.status_code == 422 and "lone surrogate" in refused.json()["detail"][0]["msg"]
    refused = client.post(
        "/api/agents/runs",
        '{"messages": [{"role": "user", "content": "hi"}], "tools": [], "model": {"scripted": [{"x": NaN}]}}',
        content_type="application/json",
        headers=headers,
    )
    assert refused.status_code == 422
    assert not Run.objects.exists()
    # A script's own error text with a lone surrogate, and a huge one: the run fails, readably.
    run = run_script_over_api(client, token_key, "raise ValueError('bad ' + chr(0xD800))")
    assert run["status"] == "failed" and run["error"] == "ValueError: bad \\ud800"
    run = run_script_over_api(client, token_key, "raise ValueError('x' * 500000)")
    assert run["status"] == "failed" and len(run["error"]) <= 4000
