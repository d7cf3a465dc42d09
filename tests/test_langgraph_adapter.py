"""The LangGraph adapter's side of the contract (grundlag_client.langgraph), without a server:
the form it asks with is one the server takes, the answers it maps are Agent Inbox's, and what
is not a HumanInterrupt is told apart. End to end, with LangGraph and a reviewer:
tests/integration/test_langgraph.py."""

from __future__ import annotations

from typing import Any

import pytest

from actions.engine.schemas import check_answer_schema, schema_errors
from grundlag_client.langgraph import answer_schema, human_response, is_human_interrupt

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
    assert human_response("send_invoice", ARGS, {"decision": "accept", "args.amount": 5}) == {
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


def test_a_human_interrupt_is_told_apart_from_other_values() -> None:
    request = {"action_request": {"action": "a", "args": {}}, "config": {"allow_accept": True}}
    assert is_human_interrupt(request)
    others: list[Any] = ["Ship it?", {"action_request": "a", "config": {}}, {"config": {}}, [request], None]
    for other in others:
        assert not is_human_interrupt(other)
