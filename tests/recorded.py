"""An action the tests register (tests/conftest.py imports this module): it never pauses and
records each time it really ran, so a test can tell a replayed call from one that ran again.
The `ran` fixture gives the record, emptied for each test."""

from __future__ import annotations

from pydantic import BaseModel

from actions.core import ActionContext, action

RAN: list[str] = []


class Note(BaseModel):
    text: str


@action(input=Note, name="noted")
def noted(ctx: ActionContext) -> dict[str, str]:
    """Records that it really ran."""
    RAN.append(ctx.input.text)
    return {"noted": ctx.input.text}
