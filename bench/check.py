"""No regression without a number: the engine's figures beside the committed baseline.

Measures, in a few minutes, what issue 38 set goals for: the engine's cycles on SQLite as a
ratio to LangGraph's in the same run, its cycles per second on PostgreSQL, and the API's step
latency and site CPU per cycle, embedded and scaled (LangGraph's in-process step measured in
the same run). Prints each beside bench/baseline.json and exits 1 when one is more than 20 %
worse: a rate or a ratio below 80 % of its baseline, a time above 125 % of it (the same loss of
speed). Run it before resolving a change to the engine, the models or the notifications; it is
not in CI, where shared machines are too noisy for a gate.

    python -m bench.check            # measure and compare (make bench-check)
    python -m bench.check --update   # measure and write the baseline (commit it with the change)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import api_latency, engine_throughput

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "bench" / "baseline.json"
TOLERANCE = 0.20  # how much worse than the baseline a figure may be before the check fails


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    higher_is_better: bool


FIGURES = [
    Figure("engine sqlite / langgraph", "x", True),
    Figure("engine postgresql", "cycles/s", True),
    Figure("api step p50 embedded", "ms", False),
    Figure("api step p50 scaled", "ms", False),
    Figure("site cpu per cycle embedded", "ms", False),
    Figure("site cpu per cycle scaled", "ms", False),
    # The embedded notifier's share of the first: a few ms, lost in the whole's spread (a
    # commit that tripled it passed the whole's check).
    Figure("notifier cpu per cycle embedded", "ms", False),
    # The API's own path, apart from the engine and the waiting: `GET /api/runs/<id>`.
    Figure("site cpu per run read embedded", "ms", False),
    Figure("site cpu per run read scaled", "ms", False),
    # What the site's processes spend to start (paid at each deploy or restart), in seconds.
    Figure("site cpu to start embedded", "s", False),
    Figure("site cpu to start scaled", "s", False),
]


def measure(seconds: float, rounds: int, cycles: int) -> dict[str, float]:
    engine, _ = engine_throughput.measure(seconds, rounds)
    embedded = api_latency.grundlag("embedded", cycles)
    scaled = api_latency.grundlag("scaled", cycles)
    langgraph = api_latency.langgraph(cycles)
    return {
        "engine sqlite / langgraph": engine["grundlag sqlite"] / engine["langgraph sqlite"],
        "engine postgresql": engine["grundlag postgresql"],
        "api step p50 embedded": api_latency.step_p50(embedded),
        "api step p50 scaled": api_latency.step_p50(scaled),
        "site cpu per cycle embedded": embedded["cpu_ms"],
        "site cpu per cycle scaled": scaled["cpu_ms"],
        "notifier cpu per cycle embedded": embedded["cpu_ms_by_process"].get("notifier", 0.0),
        "site cpu per run read embedded": embedded["read_cpu_ms"]["GET a run"],
        "site cpu per run read scaled": scaled["read_cpu_ms"]["GET a run"],
        "site cpu to start embedded": embedded["start_cpu_s"],
        "site cpu to start scaled": scaled["start_cpu_s"],
        # Not checked, for reading the others: the machine's speed in the same run.
        "langgraph sqlite cycles/s": engine["langgraph sqlite"],
        "langgraph step p50": api_latency.step_p50(langgraph),
    }


def worse_by(figure: Figure, value: float, baseline: float) -> float:
    """How much worse ``value`` is than ``baseline`` as a loss of speed (0.2: 20 % slower)."""
    if figure.higher_is_better:
        return 1 - value / baseline
    return 1 - baseline / value


def compare(measured: dict[str, float], baseline: dict[str, float]) -> list[str]:
    """The figures more than TOLERANCE worse than their baseline, each said in a line."""
    failed = []
    print(f"{'figure':<30} {'now':>10} {'baseline':>10}   change")
    for figure in FIGURES:
        value, base = measured[figure.name], baseline.get(figure.name)
        if base is None:
            print(f"{figure.name:<30} {value:>10.2f} {'-':>10}   (no baseline) {figure.unit}")
            continue
        loss = worse_by(figure, value, base)
        verdict = "WORSE" if loss > TOLERANCE else "ok"
        print(f"{figure.name:<30} {value:>10.2f} {base:>10.2f}   {-loss:+6.1%} {figure.unit:<9} {verdict}")
        if loss > TOLERANCE:
            failed.append(f"{figure.name}: {value:.2f} {figure.unit} against {base:.2f} ({-loss:+.1%})")
    for name in ("langgraph sqlite cycles/s", "langgraph step p50"):
        print(f"{name:<30} {measured[name]:>10.2f} {baseline.get(name, float('nan')):>10.2f}   (the machine)")
    return failed


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--update", action="store_true", help="write the measured figures as the baseline")
    parser.add_argument("--seconds", type=float, default=12.0, help="the engine's seconds per system")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=100, help="API cycles per setup")
    args = parser.parse_args()
    measured = measure(args.seconds, args.rounds, args.cycles)
    if args.update:
        record = {"commit": commit(), "measured": datetime.now(UTC).isoformat(timespec="seconds"), **measured}
        BASELINE.write_text(json.dumps(record, indent=2) + "\n")
        print(f"Wrote {BASELINE.relative_to(ROOT)} (commit {record['commit']}):")
        for name, value in measured.items():
            print(f"  {name:<30} {value:10.2f}")
        return 0
    baseline = json.loads(BASELINE.read_text())
    print(f"Against the baseline of {baseline.get('commit')} ({baseline.get('measured')}), at {commit()}:")
    if "site cpu measured" in baseline:  # the site's CPU is counted from a started site since
        print(f"(the site cpu figures: {baseline['site cpu measured']})")
    if "notifier cpu measured" in baseline:
        print(f"(the notifier's: {baseline['notifier cpu measured']})")
    failed = compare(measured, baseline)
    if failed:
        print(f"\nMore than {TOLERANCE:.0%} worse than the baseline:\n  " + "\n  ".join(failed))
        return 1
    print(f"\nNothing more than {TOLERANCE:.0%} worse than the baseline.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
