"""An action for fault tests: its side effect is a row in a table the test owns, so a test can
count how often the effect really happened."""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from pydantic import BaseModel

from actions.core import ActionContext, ActionInterrupt, action


class EffectInput(BaseModel):
    key: str
    seconds: float = 0.0


@action(input=EffectInput)
def counted_effect(ctx: ActionContext) -> dict[str, Any]:
    """Pause for approval; once approved, take `seconds`, then record one side effect."""
    if not ctx.resumption:
        raise ActionInterrupt("Approve the effect?", {"key": ctx.input.key})
    time.sleep(ctx.input.seconds)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_side_effects (effect_key) VALUES (%s)", [ctx.input.key])
    return {"done": ctx.input.key, "answer": ctx.resumption.data}
