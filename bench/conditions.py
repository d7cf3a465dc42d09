"""Conditions: what a step of the cost bound takes, for conditions written to be slow (issue 35).

Each condition below is costed over a large input (about what a 256 KB request can hold) and,
where the bound lets it run, evaluated: its cost, its time, and the time per step. The budget
(GRUNDLAG_CONDITION_BUDGET, 2,000,000 steps) times the slowest time per step is the longest a
step's conditions can take together. The ones not evaluated say so: their bound is over the
budget, so no interrupt ever runs them.

    python -m bench.conditions [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actions.conditions import (  # noqa: E402
    CONDITION_BUDGET,
    ConditionError,
    ConditionInput,
    ConditionTooCostly,
    compile_condition,
)

LARGE = {"big": list(range(120_000))}  # about what a 256 KB request's input can hold
STRINGS = {"s": "x" * 240_000}
LIST = {"l": list(range(3000)), "s": "x" * 5000}
SMALL = {"l": list(range(700)), "p": "y" * 1500}


def refs(expression: str, times: int, joiner: str = ",") -> str:
    return joiner.join([expression] * times)


# Each with the input it is evaluated over: the largest that shows what it costs.
CONDITIONS = {
    "list walked per naming": (f"input.big in [{refs('input.big', 180)}]", LARGE),
    "list made of namings": (f"[{refs('input.big', 50)}]", LARGE),
    "list made, 3,000": (f"[{refs('input.l', 60)}]", LIST),
    "list walked, 3,000": (f"input.l in [{refs('input.l', 10)}]", LIST),
    "strings made": (f"[{refs('input.s', 5)}]", STRINGS),
    "strings joined": (refs("input.s", 20, "+"), STRINGS),
    "pattern from the data": ("input.s.matches(input.s)", STRINGS),
    "pattern from the data, 1,500": ("input.p.matches(input.p)", SMALL),
    "pattern written": ('input.s.matches("^x+$")', STRINGS),
    "pattern written, 20,000": (r'input.s.matches("\\w{200}z")', {"s": "a" * 20_000}),
    "pattern written, 5,000": (r'input.s.matches("\\w{200}z")', {"s": "a" * 5000}),
    "pattern written, 3,000": (r'input.s.matches("\\w{200}z")', {"s": "a" * 3000}),
    "durations parsed": (
        'input.l.exists(x, has({"a": duration(input.s)}.b))',
        {"s": "1h" * 100, "l": [0] * 300},
    ),
    "input named in a loop": ('input.l.exists(x, has({"a": input}.b))', {"l": [0] * 1000}),
    "pairs over a list, 700": ("input.l.exists(a, input.l.exists(b, a == b + 1000))", SMALL),
    "one pass, 700": ("input.l.exists(a, a in input.l)", SMALL),
    "equal": ("input.l == input.l && input.s == input.s", LIST),
    "size": ("size(input.big) > 5", LARGE),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5, help="evaluations of each, the fastest kept")
    args = parser.parse_args()
    print(f"Conditions over a large input, budget {CONDITION_BUDGET:,} steps (bench/conditions.py)")
    slowest = 0.0
    for name, (text, values) in CONDITIONS.items():
        try:
            condition = compile_condition(text)
        except ConditionError as exc:
            print(f"  {name:<30} refused when saved: {exc}")
            continue
        cost = condition.cost(ConditionInput({"data": None, "input": values}).extent)
        if cost > CONDITION_BUDGET:
            print(f"  {name:<30} cost {cost:>16,}   not evaluated (over the budget)")
            continue
        best = float("inf")
        for _ in range(args.repeat):
            given = ConditionInput({"data": None, "input": values})
            began = time.perf_counter()
            try:
                condition.evaluate(given)
            except ConditionTooCostly:
                raise
            except Exception:  # noqa: BLE001, S110 - not true or false: it ran all the same
                pass
            best = min(best, time.perf_counter() - began)
        per_step = best * 1e9 / cost
        slowest = max(slowest, per_step)
        print(f"  {name:<30} cost {cost:>16,}   {best * 1000:8.2f} ms   {per_step:6.1f} ns a step")
    longest = slowest * CONDITION_BUDGET / 1e9
    print(f"  slowest {slowest:.1f} ns a step: the whole budget is at most {longest:.3f} s")


if __name__ == "__main__":
    main()
