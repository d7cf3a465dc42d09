"""Engine cycle throughput: runs that pause once and are resumed once, persisted, per second.

Grundlag on SQLite and on PostgreSQL, side by side with LangGraph (a graph whose node calls
``interrupt()``, resumed with ``Command(resume=...)``, checkpointed by langgraph-checkpoint-sqlite)
doing the same work in the same run, on the same disk. Steps run inline (GRUNDLAG_INLINE_STEPS:
in the caller's process, right after commit, as LangGraph's invoke runs its graph), so this
measures the engine and its persistence. For comparison it also measures steps handed to Celery
in eager mode: the task body runs in this process too, but the worker's claim is a transaction
of its own, and Celery's task machinery runs around each step.

    python -m bench.engine_throughput [--seconds 20] [--rounds 5] [--traces]

``--traces`` measures Grundlag with traces on (OpenTelemetry, exported by OTLP/HTTP to a
receiver this process runs, as a collector would take them).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

from bench.common import migrated_env

ROOT = Path(__file__).resolve().parents[1]


def grundlag_cycles(seconds: float) -> dict[str, Any]:
    """Runs in a child process whose environment names the database and how steps run."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "grundlag_site.settings")
    django.setup()
    from actions import engine
    from actions.models import Run, Team
    from grundlag_site.celery import run_tasks_where_sent

    run_tasks_where_sent()  # without inline steps, Celery runs each step here
    team, _ = Team.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    cycles = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        run = engine.start_run("bench_pause", {"n": cycles}, team, None)
        (interrupt,) = engine.pending_interrupts(run.pk)
        engine.resume(interrupt, {"ok": True}, None)
        cycles += 1
    elapsed = time.perf_counter() - started
    completed = Run.objects.filter(team=team, status="completed").count()
    assert completed == cycles, f"{completed} of {cycles} runs completed"
    return {"cycles": cycles, "seconds": elapsed}


class State(TypedDict, total=False):
    n: int
    answer: dict[str, Any]


def langgraph_cycles(path: Path, seconds: float) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    def approve(state: State) -> State:
        answer = interrupt({"n": state["n"]})
        return {"answer": answer}

    graph = StateGraph(State)
    graph.add_node("approve", approve)
    graph.add_edge(START, "approve")
    graph.add_edge("approve", END)
    connection = sqlite3.connect(path, check_same_thread=False)
    # The same durability trade-off Grundlag's SQLite runs with.
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    app = graph.compile(checkpointer=SqliteSaver(connection))
    cycles = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        config: Any = {"configurable": {"thread_id": f"t{cycles}"}}
        paused = app.invoke({"n": cycles}, config)
        assert "__interrupt__" in paused
        done = app.invoke(Command(resume={"ok": True}), config)
        assert done["answer"] == {"ok": True}
        cycles += 1
    return {"cycles": cycles, "seconds": time.perf_counter() - started}


# With --traces: the OTLP endpoint the children export their spans to (a receiver this
# process runs, as a collector would take them).
TRACES: dict[str, str] = {}


def measure_in_child(database_url: str, seconds: float, *, inline: bool = True) -> dict[str, Any]:
    env = migrated_env(
        database_url,
        GRUNDLAG_ACTION_MODULES="actions.examples,bench.actions",
        GRUNDLAG_INLINE_STEPS="true" if inline else "false",
        **TRACES,
    )
    out = subprocess.run(
        [sys.executable, "-m", "bench.engine_throughput", "--child", "--seconds", str(seconds)],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def rate(result: dict[str, Any]) -> float:
    return float(result["cycles"] / result["seconds"])


def measure(seconds: float, rounds: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each system's median rate (cycles/s) over ``rounds`` interleaved rounds, and the rounds'."""
    sys.path.insert(0, str(ROOT))
    from tests.integration.services import Postgres

    per_round = seconds / rounds
    rates: dict[str, list[float]] = {
        "grundlag sqlite": [],
        "langgraph sqlite": [],
        "grundlag sqlite, celery": [],
        "grundlag postgresql": [],
    }
    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        # Interleaved rounds on fresh files: the machine's drift during the run (other tenants,
        # the disk) falls on both systems alike, and the medians are compared.
        for n in range(rounds):
            sqlite_url = f"sqlite:///{tmp}/engine-{n}.sqlite3"
            rates["grundlag sqlite"].append(rate(measure_in_child(sqlite_url, per_round)))
            rates["langgraph sqlite"].append(
                rate(langgraph_cycles(Path(tmp) / f"langgraph-{n}.sqlite3", per_round))
            )
            celery_url = f"sqlite:///{tmp}/engine-celery-{n}.sqlite3"
            rates["grundlag sqlite, celery"].append(
                rate(measure_in_child(celery_url, per_round, inline=False))
            )
        postgres = Postgres()
        postgres.init()
        postgres.start()
        try:
            for n in range(rounds):
                url = postgres.create_database(f"bench{n}")
                rates["grundlag postgresql"].append(rate(measure_in_child(url, per_round)))
        finally:
            postgres.cleanup()

    medians = {name: statistics.median(values) for name, values in rates.items()}
    return medians, rates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0, help="per system, over all rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--traces", action="store_true", help="grundlag with traces on, to a local OTLP receiver"
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(grundlag_cycles(args.seconds)))
        return
    if args.traces:
        sys.path.insert(0, str(ROOT))
        from tests.integration.otlp_receiver import OtlpReceiver

        receiver = OtlpReceiver()
        TRACES["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        print(f"Traces on: exported to {receiver.endpoint}")

    medians, rates = measure(args.seconds, args.rounds)
    per_round = args.seconds / args.rounds
    print(
        "Engine cycles per second (pause once, resume once, persisted), "
        f"median of {args.rounds} interleaved rounds of {per_round:.0f} s"
    )
    for name, values in rates.items():
        rounds = ", ".join(f"{value:.1f}" for value in values)
        print(f"  {name:<24} {medians[name]:8.1f} cycles/s   (rounds: {rounds})")
    if args.traces:
        print(f"  spans received: {len(receiver.spans)}")
        receiver.stop()
    ratio = medians["grundlag sqlite"] / medians["langgraph sqlite"]
    print(f"  grundlag sqlite / langgraph sqlite: {ratio:.2f}x (goal: at least 3x)")
    print("  (goal for grundlag postgresql: at least 250 cycles/s)")


if __name__ == "__main__":
    main()
