"""Rules: the cost of evaluating a team's rules when an interrupt is created, and what 100
rules that do not match cost the engine's cycle throughput.

1. Evaluation: ``actions.engine.rules.route`` (the CEL context built once, then the team's 100
   rules evaluated in order, none holding; then the action's own; then delegation), as the
   engine calls it for each new interrupt, timed alone over many interrupts. Goal: p99 under
   1 ms. Compiled once per process: the version check rides on the statement every pause makes.
2. Throughput: the engine's pause-once/resume-once cycle (bench.engine_throughput's, inline
   steps, SQLite, persisted) with no team rules and with 100 that do not match, in
   interleaved rounds. Goal: within 10%.

    python -m bench.rules [--seconds 20] [--rounds 5] [--interrupts 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import migrated_env, percentile

ROOT = Path(__file__).resolve().parents[1]
RULES = 100


def make_rules(team: Any, count: int) -> None:
    """``count`` rules of the kinds teams write, none of which holds for the bench's runs."""
    from actions.models import TeamRule

    kinds = [
        ("has(data.amount) && data.amount > {big}.0", "approve"),
        ('requester == "nobody-{i}"', "reject"),
        ('action == "refund_{i}" && data.n < 10', "approve"),
        ('has(input.customer) && input.customer.startsWith("vip-{i}")', "assign"),
        ('data.n == -{i} || team == "elsewhere-{i}"', "require"),
    ]
    for i in range(count):
        when, then = kinds[i % len(kinds)]
        TeamRule.objects.create(
            team=team,
            name=f"rule {i}",
            when=when.format(i=i, big=10**6 + i),
            then=then,
            reason="no" if then == "reject" else "",
            approvals=2 if then == "require" else None,
            assignees="someone" if then == "assign" else "",
            position=i,
        )


def child(mode: str, seconds: float, rules_count: int, interrupts: int) -> dict[str, Any]:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "grundlag_site.settings")
    django.setup()
    from django.utils import timezone

    from actions import engine
    from actions.engine import rules
    from actions.engine.policies import effective_policy, policy_fields
    from actions.models import Run, Team

    team, _ = Team.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    make_rules(team, rules_count)
    if mode == "evaluate":
        run = engine.start_run("bench_pause", {"n": 1}, team, None)
        run = Run.objects.get(pk=run.pk)
        policy = effective_policy(team.pk, "bench_pause")
        fields = policy_fields(team.pk, "bench_pause", timezone.now(), policy)
        known = (Team.objects.get(pk=team.pk).rules_version, team.slug)
        teams = rules.team_set(team.pk, known)
        assert len(teams.rules) == rules_count
        times = []
        for n in range(interrupts):
            started = time.perf_counter()
            routed = rules.route(
                run, "bench_pause", {"n": n}, None, fields, policy, rules.team_set(team.pk, known)
            )
            times.append(time.perf_counter() - started)
            assert routed.decision is None and "rule" not in routed.note and "rule_failed" not in routed.note
        return {"times": times}
    from bench.engine_throughput import grundlag_cycles

    return grundlag_cycles(seconds)  # the same loop, on the same team, its rules made above


def in_child(
    database_url: str, mode: str, seconds: float, rules_count: int, interrupts: int = 0
) -> dict[str, Any]:
    env = migrated_env(
        database_url, GRUNDLAG_ACTION_MODULES="actions.examples,bench.actions", GRUNDLAG_INLINE_STEPS="true"
    )
    out = subprocess.run(
        [sys.executable, "-m", "bench.rules", "--child", mode, "--seconds", str(seconds),
         "--rules", str(rules_count), "--interrupts", str(interrupts)],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="throughput, per variant, over all rounds"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interrupts", type=int, default=5000)
    parser.add_argument("--rules", type=int, default=RULES)
    parser.add_argument("--child", choices=["evaluate", "cycles"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds, args.rules, args.interrupts)))
        return

    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        times = in_child(f"sqlite:///{tmp}/evaluate.sqlite3", "evaluate", 0, args.rules, args.interrupts)[
            "times"
        ]
        micros = [t * 1e6 for t in times]
        print(
            f"Rule evaluation per new interrupt, {args.rules} team rules, none holding"
            f" ({len(micros)} interrupts)"
        )
        print(
            f"  p50 {percentile(micros, 0.5):7.1f} us   p99 {percentile(micros, 0.99):7.1f} us"
            f"   max {max(micros):7.1f} us   (goal: p99 under 1000 us)"
        )
        per_round = args.seconds / args.rounds
        rates: dict[str, list[float]] = {"no rules": [], f"{args.rules} rules": []}
        for n in range(args.rounds):
            for name, count in (("no rules", 0), (f"{args.rules} rules", args.rules)):
                url = f"sqlite:///{tmp}/cycles-{count}-{n}.sqlite3"
                result = in_child(url, "cycles", per_round, count)
                rates[name].append(result["cycles"] / result["seconds"])
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"Engine cycles per second (SQLite, inline steps), median of {args.rounds} interleaved rounds")
    for name, values in rates.items():
        rounds = ", ".join(f"{value:.1f}" for value in values)
        print(f"  {name:<12} {medians[name]:8.1f} cycles/s   (rounds: {rounds})")
    ratio = medians[f"{args.rules} rules"] / medians["no rules"]
    print(f"  with rules / without: {ratio:.3f} (goal: at least 0.90)")


if __name__ == "__main__":
    main()
