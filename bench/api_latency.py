"""API step latency, as an API caller sees it: `POST /api/runs` of an action that pauses, with
`Prefer: wait`, until the response says `interrupted`; then `POST .../resume` until it says
`completed`. p50/p99 over sequential cycles, on the embedded setup (`manage.py serve`: SQLite,
the worker in the same process) and the scaled one (PostgreSQL, Redis, one daphne, one Celery
worker process), beside LangGraph's in-process `invoke` of the same action (pause, then resume
with `Command`), checkpointed to SQLite, in this process. Also what a cycle costs the site's
processes in CPU: on two cores the latency follows it, and it is less at the mercy of the
machine's other tenants than the latency is.

    python -m bench.api_latency [--cycles 50]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import cpu_by_process, cpu_seconds, database_for, percentile, served_site  # noqa: E402
from tests.integration.processes import Server  # noqa: E402


def line(name: str, what: str, samples: list[float]) -> str:
    return (
        f"  {name:<22} {what:<24} p50 {statistics.median(samples):7.1f} ms   "
        f"p99 {percentile(samples, 0.99):7.1f} ms   ({len(samples)} cycles)"
    )


def api_cycles(server: Server, token: str, cycles: int) -> tuple[list[float], list[float]]:
    started_ms, resumed_ms = [], []
    with server.client(token) as client:
        client.headers["Prefer"] = "wait=30"
        for n in range(cycles + 3):
            begin = time.perf_counter()
            run = client.post("/api/runs", json={"action": "bench_pause", "input": {"n": n}}).json()
            paused = time.perf_counter()
            assert run.get("status") == "interrupted", run
            done = client.post(run["interrupt"]["resume_url"], json={"data": {"ok": True}}).json()
            resumed = time.perf_counter()
            assert done["status"] == "completed", done
            if n >= 3:  # the first cycles warm the server up
                started_ms.append((paused - begin) * 1000)
                resumed_ms.append((resumed - paused) * 1000)
    return started_ms, resumed_ms


class Figures(TypedDict, total=False):
    started: list[float]  # ms, each cycle's start -> interrupted (LangGraph: invoke -> interrupt)
    resumed: list[float]  # ms, resume -> completed (LangGraph: resume -> done)
    cpu_ms: float  # the site's processes' CPU per cycle (LangGraph: this process's)
    cpu_ms_by_process: dict[str, float]  # the same, by process ("serve", "notifier", a worker)
    # The site's CPU per request of a plain read, beside the cycle's: `GET /api/runs/<id>` of a
    # paused run, and `/healthz` (no authentication, no database): what the API's own path
    # costs, apart from the engine and the waiting.
    read_cpu_ms: dict[str, float]
    # The site's processes' CPU to start (server, workers, notifier; not migrate or the seed), in s.
    start_cpu_s: float


READS = 100


def read_cpu(pids: list[int], server: Server, token: str) -> dict[str, float]:
    """The site's CPU per request of a few plain reads, each sent READS times in a row."""
    costs = {}
    with server.client(token) as client:
        run = client.post(
            "/api/runs", json={"action": "bench_pause", "input": {"n": 0}}, headers={"Prefer": "wait=5"}
        ).json()
        for what, url in (("GET a run", f"/api/runs/{run['id']}"), ("GET /healthz", "/healthz")):
            client.get(url)
            before = cpu_seconds(pids)
            for _ in range(READS):
                assert client.get(url).status_code == 200
            costs[what] = (cpu_seconds(pids) - before) / READS * 1000
    return costs


def grundlag(name: str, cycles: int) -> Figures:
    with (
        database_for(name, "api_latency") as (tmp, database_url),
        served_site(tmp, database_url, scaled=name == "scaled") as (site, server, token),
    ):
        pids = [process.pid for process in site.processes]
        # Started (bench.common.settle_started): what the start cost, each process since it began.
        before = cpu_by_process(pids)
        started, resumed = api_cycles(server, token, cycles)
        # What a cycle costs the site's processes (the server, the workers, the notifier; not
        # PostgreSQL or Redis): on two cores, latency follows it; less noisy than the latency.
        by_process = {
            kind: (seconds - before.get(kind, 0.0)) / (cycles + 3) * 1000
            for kind, seconds in cpu_by_process(pids).items()
        }
        cpu_ms = sum(by_process.values())
        cpu_before = sum(before.values())
        reads = read_cpu(pids, server, token)
    return Figures(
        started=started,
        resumed=resumed,
        cpu_ms=cpu_ms,
        cpu_ms_by_process=by_process,
        read_cpu_ms=reads,
        start_cpu_s=cpu_before,
    )


def lines(name: str, figures: Figures) -> list[str]:
    what = (
        ("invoke -> interrupt", "resume -> done")
        if name.startswith("langgraph")
        else ("start -> interrupted", "resume -> completed")
    )
    return [
        line(name, what[0], figures["started"]),
        line(name, what[1], figures["resumed"]),
        f"  {name:<22} {'CPU per cycle':<24} {figures['cpu_ms']:7.1f} ms",
        *(
            f"  {name:<22} {'  of which ' + kind:<24} {ms:7.1f} ms"
            for kind, ms in sorted(figures.get("cpu_ms_by_process", {}).items(), key=lambda item: -item[1])
        ),
        *(
            f"  {name:<22} {'CPU per ' + what:<24} {ms:7.1f} ms"
            for what, ms in figures.get("read_cpu_ms", {}).items()
        ),
        *(
            [f"  {name:<22} {'CPU to start the site':<24} {figures['start_cpu_s']:7.2f} s"]
            if "start_cpu_s" in figures
            else []
        ),
    ]


def step_p50(figures: Figures) -> float:
    """The median of a step (a start or a resume), in ms."""
    return statistics.median(figures["started"] + figures["resumed"])


class State(TypedDict, total=False):
    n: int
    answer: dict[str, Any]


def langgraph(cycles: int) -> Figures:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    def approve(state: State) -> State:
        return {"answer": interrupt({"n": state["n"]})}

    graph = StateGraph(State)
    graph.add_node("approve", approve)
    graph.add_edge(START, "approve")
    graph.add_edge("approve", END)
    started_ms, resumed_ms = [], []
    with tempfile.TemporaryDirectory(prefix="langgraph-bench-") as tmp:
        connection = sqlite3.connect(Path(tmp) / "lg.sqlite3", check_same_thread=False)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        app = graph.compile(checkpointer=SqliteSaver(connection))
        cpu_before = time.process_time()
        for n in range(cycles + 3):
            config: Any = {"configurable": {"thread_id": f"t{n}"}}
            begin = time.perf_counter()
            assert "__interrupt__" in app.invoke({"n": n}, config)
            paused = time.perf_counter()
            assert app.invoke(Command(resume={"ok": True}), config)["answer"] == {"ok": True}
            resumed = time.perf_counter()
            if n >= 3:
                started_ms.append((paused - begin) * 1000)
                resumed_ms.append((resumed - paused) * 1000)
        cpu_ms = (time.process_time() - cpu_before) / (cycles + 3) * 1000
        connection.close()
    return Figures(started=started_ms, resumed=resumed_ms, cpu_ms=cpu_ms)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=50)
    args = parser.parse_args()
    print("API step latency, as the caller sees it (Prefer: wait), sequential cycles")
    print(
        "Goals: a step's p50 at most 3x LangGraph's in-process one embedded, 5x scaled; site CPU"
        " per cycle at most 20 ms embedded, 35 ms scaled"
    )
    figures = {name: grundlag(name, args.cycles) for name in ("embedded", "scaled")}
    figures["langgraph in-process"] = langgraph(args.cycles)
    for name, each in figures.items():
        for text in lines(name, each):
            print(text, flush=True)
    reference = step_p50(figures["langgraph in-process"])
    for name in ("embedded", "scaled"):
        print(f"  {name:<22} {'step p50 vs LangGraph':<24} {step_p50(figures[name]) / reference:7.1f}x")


if __name__ == "__main__":
    main()
