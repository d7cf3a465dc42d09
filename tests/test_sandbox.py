"""The sandbox consumer: scripts, their call log, replay, divergence and containment."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from actions import engine
from actions.drivers.agent import start_agent
from actions.drivers.sandbox import run_script, start_script
from actions.models import Run, Team

# Runs with steps in workers and inline (tests/conftest.py).
# Slow: each script runs in a child process (make test runs them, make check does not).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps"), pytest.mark.slow]


def script(team: Team, source: str, **payload: Any) -> Run:
    run = start_script(source, payload, team, None)
    run.refresh_from_db()
    return run


THREE_CALLS = """
before = tools.noted(text="before")
sent = call("send_invoice", {"invoice_id": input["invoice"], "amount": 5})
after = tools.noted(text="after")
return [before["noted"], sent["sent"], after["noted"]]
"""


def test_a_paused_call_is_replayed_without_running_logged_calls_again(
    team: Team, reviewer: User, ran: list[str]
) -> None:
    run = script(team, THREE_CALLS, invoice="S-1")
    assert run.status == "interrupted" and ran == ["before"]
    assert run.driver_state["paused"] == {
        "position": 1,
        "action": "send_invoice",
        "input": {"invoice_id": "S-1", "amount": 5},
    }
    interrupt = run.interrupts.get()
    assert (interrupt.action, interrupt.message) == ("send_invoice", "Approve sending the invoice?")

    engine.resume(interrupt, {"approved": True}, reviewer)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", ["before", True, "after"])
    assert ran == ["before", "after"], "the logged call was replayed, not run again"
    log = run.driver_state["call_log"]
    assert [(e["position"], e["action"]) for e in log] == [(0, "noted"), (1, "send_invoice"), (2, "noted")]
    assert log[1]["result"]["approved_by_answer"] == {"approved": True}


def test_a_script_can_pause_several_times_and_each_pause_extends_the_log(team: Team, reviewer: User) -> None:
    source = """
first = tools.transfer_funds(amount=10, to="A")
second = tools.transfer_funds(amount=20, to="B")
return [first["transferred"], second["transferred"]]
"""
    run = script(team, source)
    engine.resume(run.interrupts.get(seq=1), {"approved": True}, reviewer)
    run.refresh_from_db()
    assert run.status == "interrupted" and len(run.driver_state["call_log"]) == 1
    assert run.driver_state["paused"]["position"] == 1
    engine.resume(run.interrupts.get(seq=2), {"approved": True}, reviewer)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", [True, True])


def test_a_rejected_call_ends_the_script_run_rejected(team: Team, reviewer: User) -> None:
    run = script(team, THREE_CALLS, invoice="S-2")
    engine.reject(run.interrupts.get(), "not now", reviewer)
    run.refresh_from_db()
    assert (run.status, run.error) == ("rejected", "not now")


def test_a_script_that_diverges_from_its_log_fails_naming_the_position(
    team: Team, reviewer: User, ran: list[str]
) -> None:
    run = script(team, THREE_CALLS, invoice="S-3")
    # As if the script had changed its mind: the log says another call came first.
    state = run.driver_state
    state["call_log"][0]["input"] = {"text": "something else"}
    Run.objects.filter(pk=run.pk).update(driver_state=state)
    engine.resume(run.interrupts.get(), {"approved": True}, reviewer)
    run.refresh_from_db()
    assert run.status == "failed"
    assert run.error == (
        'the script diverged from its call log at position 0: expected noted({"text": "something else"}), '
        'got noted({"text": "before"})'
    )
    assert ran == ["before"], "nothing ran after the divergence"


def test_a_failed_action_raises_inside_the_script_where_it_can_be_handled(team: Team) -> None:
    source = """
try:
    tools.send_invoice(invoice_id="", amount=-1)
except ActionFailed as exc:
    return "handled: " + str(exc)
"""
    run = script(team, source)
    assert run.status == "completed" and str(run.output).startswith("handled: invalid input: invoice_id:")


ESCAPES = [
    ("import os\nreturn os.getcwd()", r"ImportError: import of 'os' is not allowed"),
    ("return open('/etc/passwd').read()", r"NameError: name 'open' is not defined"),
    ("return ().__class__.__subclasses__()", r"does not compile: .*invalid attribute name"),
    ("return getattr((), '__class__')", r"invalid attribute name because it starts with \"_\""),
    (
        "g = (x for x in [1])\nreturn g.gi_frame.f_globals",
        r"(does not compile|not allowed|invalid attribute)",
    ),
    ("return '{0.__class__}'.format(())", r"format\*\(\) methods of `str` is not safe"),
    ("while True:\n    pass", r"the script exceeded its CPU time \(1 s\)"),
    ("x = 'a' * (10 ** 10)\nreturn len(x)", r"the script ran out of memory"),
    (
        "blocks = []\nwhile True:\n    blocks.append([0] * 1000000)",
        r"(ran out of memory|exceeded its CPU time)",
    ),
    ("import os\nwhile True:\n    os.fork()", r"ImportError: import of 'os' is not allowed"),
    (
        "import subprocess\nreturn subprocess.run(['id'])",
        r"ImportError: import of 'subprocess' is not allowed",
    ),
    ("def f():\n    return f()\nreturn f()", r"recursed too deeply"),
]


@pytest.mark.parametrize(("source", "error"), ESCAPES, ids=[e[1][:30] for e in ESCAPES])
def test_escape_attempts_are_contained_with_a_clear_error(
    team: Team, source: str, error: str, settings: Any
) -> None:
    settings.GRUNDLAG_SANDBOX_CPU_SECONDS = 1
    settings.GRUNDLAG_SANDBOX_MEMORY_BYTES = 256 * 1024 * 1024
    run = script(team, source)
    assert run.status == "failed"
    assert __import__("re").search(error, run.error), run.error
    # The server is unaffected: the next script runs normally.
    assert run_script("return 1 + 1", {})[0] == 2


def test_a_script_that_outlives_its_wall_time_is_stopped(team: Team, settings: Any) -> None:
    settings.GRUNDLAG_SANDBOX_WALL_SECONDS = 1
    settings.GRUNDLAG_SANDBOX_CPU_SECONDS = 30
    run = script(team, "n = 0\nwhile True:\n    n += 1")
    assert run.error == "the script exceeded its wall time (1 s)"


def test_the_script_api_reports_the_call_log_and_where_it_paused(team: Team, token_key: str) -> None:
    client = Client(headers={"Authorization": f"Bearer {token_key}", "Prefer": "wait=10"})
    started = client.post(
        "/api/scripts/runs",
        json.dumps({"source": THREE_CALLS, "input": {"invoice": "API-1"}}),
        content_type="application/json",
    ).json()
    assert started["status"] == "interrupted" and started["consumer"] == "sandbox"
    detail = client.get(f"/api/scripts/runs/{started['id']}").json()
    assert detail["paused_at"] == 1 and [e["action"] for e in detail["call_log"]] == ["noted"]
    done = client.post(
        f"/api/interrupts/{started['interrupt']['id']}/resume",
        json.dumps({"data": {"ok": 1}}),
        content_type="application/json",
    ).json()
    assert (done["status"], done["output"]) == ("completed", ["before", True, "after"])
    assert client.get(f"/api/scripts/runs/{started['id']}").json()["paused_at"] is None


def test_a_registered_script_is_an_action_for_the_api_and_for_agents(team: Team, reviewer: User) -> None:
    run = engine.start_run(
        "bill_customer", {"customer_id": "c7", "invoice_id": "B-7", "amount": 70}, team, None
    )
    run.refresh_from_db()
    interrupt = run.interrupts.get()
    assert (interrupt.action, interrupt.message) == ("bill_customer", "Approve sending the invoice?")
    engine.resume(interrupt, {"approved": True}, reviewer)
    run.refresh_from_db()
    assert run.output == {"customer": "Customer 154", "sent": True, "invoice_id": "B-7"}

    turns = [
        {
            "tool_calls": [
                {
                    "id": "b",
                    "name": "bill_customer",
                    "arguments": {"customer_id": "c7", "invoice_id": "B-8", "amount": 8},
                }
            ]
        },
        {"content": "billed"},
    ]
    agent_run = start_agent(
        [{"role": "user", "content": "bill"}], ["bill_customer"], {"scripted": turns}, team, None
    )
    agent_run.refresh_from_db()
    assert agent_run.status == "interrupted" and agent_run.interrupts.get().tool_call_id == "b"
    engine.resume(agent_run.interrupts.get(), {"approved": True}, reviewer)
    agent_run.refresh_from_db()
    assert (agent_run.status, agent_run.output) == ("completed", "billed")


def test_the_run_page_shows_the_script_its_call_log_and_the_pause(team: Team, reviewer: User) -> None:
    run = script(team, THREE_CALLS, invoice="PAGE-1")
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "sent = call(&quot;send_invoice&quot;" in page
    assert "paused here, waiting for a decision" in page and "PAGE-1" in page


def test_a_scripts_process_runs_after_the_servers_at_a_lower_priority(team: Team, settings: Any) -> None:
    """A team's CPU-bound scripts slow its own scripts, not every team's requests (issue 35)."""
    import os
    import threading
    import time
    from pathlib import Path

    settings.GRUNDLAG_SANDBOX_CPU_SECONDS = 2
    seen: set[int] = set()
    stop = threading.Event()

    def sample() -> None:  # the niceness of this process's descendants while the script runs
        while not stop.is_set():
            for proc in Path("/proc").iterdir():
                try:
                    if proc.name.isdigit() and int(proc.name) != os.getpid():
                        name, rest = (proc / "stat").read_text().rsplit(")", 1)
                        stat = rest.split()
                        # The script's: `nice`, bwrap, the child's interpreter (not the session's
                        # PostgreSQL, also started by this process).
                        ours = name.split("(", 1)[1].startswith(("nice", "bwrap", "python"))
                        if ours and int(stat[1]) != os.getpid() and _descends(int(stat[1])):
                            seen.add(int(stat[16]))  # field 19 of stat: nice
                except (OSError, ValueError):
                    continue
            time.sleep(0.05)

    def _descends(pid: int) -> bool:
        for _ in range(10):
            if pid == os.getpid():
                return True
            if pid <= 1:
                return False
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return False

    from actions.drivers import sandbox

    sandbox.check_isolation()  # its probe of bubblewrap (once per process) runs before sampling
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run = script(team, "while True:\n    pass\n")
    finally:
        stop.set()
        sampler.join()
    assert run.status == Run.Status.FAILED
    assert seen == {10}, seen  # from the first instruction: `nice`, bwrap, the child's start, the script
