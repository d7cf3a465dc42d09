"""The action the benchmarks run: it pauses once and completes when resumed."""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel

from actions.core import ActionContext, ActionInterrupt, action


class Cycle(BaseModel):
    n: int


@action(input=Cycle)
def bench_pause(ctx: ActionContext) -> dict[str, Any]:
    """Pause once; done when resumed."""
    if ctx.resumption is None:
        raise ActionInterrupt("Approve?", {"n": ctx.input.n})
    return {"n": ctx.input.n, "answer": ctx.resumption.data}


class Effect(BaseModel):
    key: str
    seconds: float = 0.0


@action(input=Effect)
def bench_effect(ctx: ActionContext) -> dict[str, Any]:
    """Pause once; when resumed, work for `seconds`, then record one side effect: a line in the
    file GRUNDLAG_BENCH_EFFECTS names (the recovery benchmark counts them)."""
    if ctx.resumption is None:
        raise ActionInterrupt("Approve?", {"key": ctx.input.key})
    time.sleep(ctx.input.seconds)
    with open(os.environ["GRUNDLAG_BENCH_EFFECTS"], "a") as effects:
        effects.write(f"{ctx.input.key}\n")
    return {"key": ctx.input.key}
