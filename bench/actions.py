"""The action the benchmarks run: it pauses once and completes when resumed."""

from __future__ import annotations

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
