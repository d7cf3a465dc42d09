"""The LangGraph adapter's side of the contract (grundlag_client.langgraph), without a server:
the form it asks with is one the server takes, the answers it maps are Agent Inbox's, and what
is not a HumanInterrupt is told apart. End to end, with LangGraph and a reviewer:
tests/integration/test_langgraph.py."""

from __future__ import annotations

from typing import Any

import pytest

from actions.engine.schemas import check_answer_schema, schema_errors
from grundlag_client._calls import edit_schema, edited
from grundlag_client.langgraph import _key, answer_schema, human_response, is_human_interrupt

ARGS = {"invoice_id": "LG-1", "amount": 900, "rush": False, "lines": [1, 2], "to": {"name": "ACME"}}
EVERY = ["accept", "edit", "response", "ignore"]


@pytest.mark.parametrize("allowed", [EVERY, ["accept"], ["response"], ["edit", "ignore"]])
def test_the_form_it_asks_with_is_one_the_server_takes(allowed: list[str]) -> None:
    schema = answer_schema(ARGS, allowed)
    check_answer_schema(schema)  # raises what the API would answer 422 with
    assert schema["properties"]["decision"]["enum"] == allowed
    assert ("args.amount" in schema["properties"]) is ("edit" in allowed)
    assert ("response" in schema["properties"]) is ("response" in allowed)


@pytest.mark.parametrize(
    ("answer", "errors"),
    [
        ({"decision": "accept"}, False),
        ({"decision": "response", "response": "use the EU account"}, False),
        ({"decision": "response"}, True),  # a response says something
        ({"decision": "response", "response": ""}, True),
        ({"decision": "edit", "args.amount": "ninety"}, True),  # typed as the argument is
        ({"decision": "drop it"}, True),  # only what the config allows
        ({}, True),
    ],
)
def test_the_server_checks_the_answer_against_it(answer: dict[str, Any], errors: bool) -> None:
    assert bool(schema_errors(answer_schema(ARGS, EVERY), answer)) is errors


def test_answers_are_agent_inboxs_human_responses() -> None:
    untouched = {f"args.{name}": value for name, value in ARGS.items()}  # as the form posts them
    assert human_response("send_invoice", ARGS, {"decision": "accept", **untouched}) == {
        "type": "accept",
        "args": None,
    }
    assert human_response("send_invoice", ARGS, {"decision": "edit", "args.amount": 90}) == {
        "type": "edit",
        "args": {"action": "send_invoice", "args": {**ARGS, "amount": 90}},
    }
    assert human_response("send_invoice", ARGS, {"decision": "response", "response": "no"}) == {
        "type": "response",
        "args": "no",
    }
    assert human_response("send_invoice", ARGS, {"decision": "ignore"}) == {"type": "ignore", "args": None}
    with pytest.raises(ValueError, match="not a response"):
        human_response("send_invoice", ARGS, {"decision": "approve"})


def test_arguments_changed_under_accept_are_an_edit_what_runs_is_what_was_approved() -> None:
    assert human_response("send_invoice", ARGS, {"decision": "accept", "args.amount": 5}) == {
        "type": "edit",
        "args": {"action": "send_invoice", "args": {**ARGS, "amount": 5}},
    }


def test_a_browsers_field_does_not_edit_what_it_did_not_change() -> None:
    proposed = {"body": "Dear ACME,\n\nplease pay.\n", "to": " ops@acme.example", "n": 900}
    posted = {"body": "Dear ACME,\r\n\r\nplease pay.", "to": "ops@acme.example", "n": 900.0}
    assert edited(proposed, posted) == proposed  # the same text, as a text box sends it back
    assert edited(proposed, {**posted, "n": 90}) == {**proposed, "n": 90}
    # An answer that is not this form's (a rule's, a bulk approval's) adds no argument.
    assert edited(proposed, {"approved": True, "comment": ""}) == proposed


@pytest.mark.parametrize("schema", [answer_schema(ARGS, EVERY), edit_schema(ARGS)])
def test_a_bulk_approvals_answer_does_not_fit_the_forms(schema: dict[str, Any]) -> None:
    check_answer_schema(schema)
    assert schema_errors(schema, {"approved": True, "comment": ""})


def test_long_or_multi_line_text_is_edited_in_a_text_box() -> None:
    form = edit_schema({"body": "line one\nline two", "subject": "Hello"})
    assert form["properties"]["body"]["maxLength"] > 200  # the dashboard's text box
    assert "maxLength" not in form["properties"]["subject"]


def test_idempotency_keys_are_short_ascii_whatever_the_thread() -> None:
    for thread in ("t-1", "Bestellung für München", "x" * 5000, "tab\there"):
        key = _key({"configurable": {"thread_id": thread}}, "0123456789abcdef" * 2)
        assert key.isascii() and key.isprintable() and len(key) <= 255
    assert _key({"configurable": {"thread_id": "a"}}, "i") != _key({"configurable": {"thread_id": "b"}}, "i")
    assert _key({"configurable": {}}, "i") == ""


def test_a_human_interrupt_is_told_apart_from_other_values() -> None:
    request = {"action_request": {"action": "a", "args": {}}, "config": {"allow_accept": True}}
    assert is_human_interrupt(request)
    others: list[Any] = ["Ship it?", {"action_request": "a", "config": {}}, {"config": {}}, [request], None]
    for other in others:
        assert not is_human_interrupt(other)


def graph_with_a_breakpoint() -> Any:
    from typing import TypedDict

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        n: int

    builder = StateGraph(State)
    builder.add_node("first", lambda state: {"n": state["n"] + 1})
    builder.add_node("second", lambda state: {"n": state["n"] + 1})
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile(checkpointer=InMemorySaver(), interrupt_before=["second"])


def test_a_graph_stopped_at_a_breakpoint_is_not_taken_for_one_that_ended() -> None:
    from grundlag_client import Client
    from grundlag_client.langgraph import run_with_inbox

    with Client("http://127.0.0.1:9", "unused") as client, pytest.raises(RuntimeError, match="breakpoint"):
        run_with_inbox(
            graph_with_a_breakpoint(), {"n": 0}, {"configurable": {"thread_id": "b"}}, client=client
        )


def test_multi_line_text_left_alone_under_accept_stays_an_accept() -> None:
    args = {"body": "Dear ACME,\nplease pay.", "to": "ops@acme.example"}
    form = answer_schema(args, ["accept", "edit"])
    assert form["properties"]["args.body"]["maxLength"] > 200  # a text box, which keeps its lines
    posted = {"decision": "accept", "args.body": "Dear ACME,\r\nplease pay.", "args.to": "ops@acme.example"}
    assert human_response("send", args, posted) == {"type": "accept", "args": None}
