"""The contract in actions.core, without a database."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from actions.core import (
    MAX_NESTING,
    ActionContext,
    ActionError,
    ActionInterrupt,
    ActionResumption,
    Completed,
    Failed,
    Interrupted,
    Registry,
    UnknownAction,
    _first_problem,
    action,
    invoke,
    registry,
    value_problem,
)


class Ping(BaseModel):
    n: int


def test_core_imports_nothing_from_django() -> None:
    code = "import sys, actions.core; print([m for m in sys.modules if m.split('.')[0] == 'django'])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    assert out.stdout.strip() == "[]"


def test_interrupt_carries_message_data_and_state() -> None:
    exc = ActionInterrupt("Approve?", {"id": 1}, state={"step": 2})
    assert (exc.message, exc.data, exc.state) == ("Approve?", {"id": 1}, {"step": 2})
    assert isinstance(exc, Exception)
    assert str(exc) == "Approve?"


def test_interrupt_with_unserialisable_data_fails_at_raise_time_naming_the_value() -> None:
    with pytest.raises(TypeError, match=r"data\.when is a datetime"):
        ActionInterrupt("Approve?", {"when": datetime.datetime.now()})
    with pytest.raises(TypeError, match=r"state\[1\] is nan"):
        ActionInterrupt("Approve?", None, [1, float("nan")])
    with pytest.raises(TypeError, match="key 3 of type int"):
        ActionInterrupt("Approve?", {3: "x"})


def test_resumption_is_frozen() -> None:
    resumption = ActionResumption({"ok": True}, state=[1])
    with pytest.raises(AttributeError):
        resumption.data = None  # type: ignore[misc]


def test_decorator_registers_with_name_and_docstring_defaults() -> None:
    @action(input=Ping)
    def contract_ping(ctx: ActionContext) -> int:
        """Ping back."""
        return int(ctx.input.n)

    assert registry.get("contract_ping") is contract_ping
    assert contract_ping.description == "Ping back."
    assert contract_ping.input_schema()["properties"]["n"]["type"] == "integer"
    assert contract_ping.answer_schema() is None
    assert "contract_ping" in [act.name for act in registry.all()]


def test_registering_another_function_under_a_taken_name_is_refused() -> None:
    local = Registry()

    def one(ctx: ActionContext) -> None: ...

    def two(ctx: ActionContext) -> None: ...

    from actions.core import Action

    local.register(Action("same", one, Ping))
    with pytest.raises(ValueError, match="already registered"):
        local.register(Action("same", two, Ping))
    with pytest.raises(UnknownAction):
        local.get("missing")


@action(input=Ping, name="contract_pause_twice")
def pause_twice(ctx: ActionContext) -> dict[str, object]:
    if ctx.resumption is None:
        raise ActionInterrupt("first", {"n": ctx.input.n})
    if ctx.resumption.state is None:
        raise ActionInterrupt("second", None, state={"first": ctx.resumption.data})
    return {"answers": [ctx.resumption.state["first"], ctx.resumption.data]}


def test_invoke_reports_an_interrupt_then_completes_when_resumed_with_state() -> None:
    first = invoke("contract_pause_twice", {"n": 1})
    assert first == Interrupted("first", {"n": 1}, None)
    second = invoke("contract_pause_twice", {"n": 1}, ActionResumption("yes"))
    assert isinstance(second, Interrupted) and second.state == {"first": "yes"}
    done = invoke("contract_pause_twice", {"n": 1}, ActionResumption("sure", second.state))
    assert done == Completed({"answers": ["yes", "sure"]})


def test_invalid_input_is_a_failure_with_field_errors_not_an_exception() -> None:
    outcome = invoke("contract_pause_twice", {"n": "not a number"})
    assert isinstance(outcome, Failed)
    assert outcome.error.startswith("invalid input: n:")
    assert outcome.field_errors and outcome.field_errors[0]["loc"] == ["n"]


def test_exceptions_become_failures_and_action_error_keeps_its_message() -> None:
    @action(input=Ping, name="contract_boom")
    def boom(ctx: ActionContext) -> None:
        raise ValueError("no such account")

    @action(input=Ping, name="contract_declined")
    def declined(ctx: ActionContext) -> None:
        raise ActionError("transfer declined")

    assert invoke(boom, {"n": 1}) == Failed("ValueError: no such account")
    assert invoke(declined, {"n": 1}) == Failed("transfer declined")


def test_unserialisable_output_or_interrupt_payload_fails_with_which_value() -> None:
    @action(input=Ping, name="contract_bad_output")
    def bad_output(ctx: ActionContext) -> object:
        return {"at": {1, 2}}

    @action(input=Ping, name="contract_bad_state")
    def bad_state(ctx: ActionContext) -> None:
        raise ActionInterrupt("x", state={"conn": object()})

    outcome = invoke(bad_output, {"n": 1})
    assert isinstance(outcome, Failed) and "output.at is a set" in outcome.error
    outcome = invoke(bad_state, {"n": 1})
    assert isinstance(outcome, Failed) and "state.conn is a object" in outcome.error


def test_async_actions_run_and_interrupt() -> None:
    @action(input=Ping, name="contract_async")
    async def async_ping(ctx: ActionContext) -> int:
        if not ctx.resumption:
            raise ActionInterrupt("async pause", {"n": ctx.input.n})
        return int(ctx.input.n) + int(ctx.resumption.data)

    assert invoke(async_ping, {"n": 2}) == Interrupted("async pause", {"n": 2}, None)
    assert invoke(async_ping, {"n": 2}, ActionResumption(40)) == Completed(42)


async def test_async_actions_can_be_invoked_from_inside_an_event_loop() -> None:
    outcome = invoke("publish_announcement", {"title": "t"}, ActionResumption({"approved": True}))
    assert outcome == Completed({"published": "t"})


def test_answer_model_validates_answers() -> None:
    act = registry.get("delete_customer_data")
    assert act.validate_answer({"confirm_customer_id": "c1", "ticket": "T-1"}) == {
        "confirm_customer_id": "c1",
        "scope": "personal_data",
        "notify_customer": True,
        "ticket": "T-1",
    }
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        act.validate_answer({"confirm_customer_id": "c1", "scope": "nothing", "ticket": "T-1"})


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and the infinities included
    st.text(alphabet=st.characters(codec=None, exclude_categories=())),  # NUL and lone surrogates
    st.sampled_from(["\\u0000", "[[[[", "{{", "\x00"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(
            st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=3), inner, max_size=4
        )
        | st.dictionaries(st.integers() | st.floats(), inner, max_size=2)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(value=_VALUES, depth=st.integers(min_value=0, max_value=6))
def test_the_quick_check_of_a_stored_value_agrees_with_the_walk_that_names_the_path(
    value: Any, depth: int
) -> None:
    """value_problem tells a value without problems apart in C, and walks only where there may be
    one: it finds exactly what the full walk finds, at the same place."""
    assert value_problem(value, depth) == _first_problem(value, depth)


def test_a_plain_value_is_told_apart_without_the_walk_that_names_the_path() -> None:
    """The quick check's point: a large plain value, or a string of brackets, is not walked."""
    from actions.core import _plainly_storable

    assert _plainly_storable({"items": [1.5] * 20_000, "note": "[" * 100_000}, MAX_NESTING)
    assert _plainly_storable("[" * 100_000, MAX_NESTING)
    assert not _plainly_storable({"a": float("nan")}, MAX_NESTING)
