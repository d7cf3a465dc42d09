"""LangGraph (the real package) with the team's inbox, through the Python client's adapter
(grundlag_client.langgraph), against `make run`'s server: a graph's interrupts are asked as
approvals, a reviewer decides each on its page as a browser would, and the graph resumes with
exactly that decision, in Agent Inbox's form where the interrupt has it."""

from __future__ import annotations

import asyncio
import operator
import re
import threading
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from grundlag_client import Client, Rejected, TimedOut
from grundlag_client.langgraph import arun_with_inbox, ask_inbox, resume_from_webhook, run_with_inbox
from tests.integration.processes import Server, Site, decide, decide_when_asked, logged_in_reviewer, wait_for
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.integration


class State(TypedDict):
    heard: Annotated[list[Any], operator.add]


def graph_of(*asks: Any, saver: Any = None) -> Any:
    """A graph of one node per value in ``asks``, each pausing with it and keeping what it
    resumed with, on LangGraph's own in-memory checkpointer (``saver``: a given one)."""
    builder = StateGraph(State)
    previous = START
    for n, value in enumerate(asks):

        def node(state: State, value: Any = value) -> dict[str, Any]:
            return {"heard": [interrupt(value)]}

        builder.add_node(f"ask{n}", node)
        builder.add_edge(previous, f"ask{n}")
        previous = f"ask{n}"
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=saver or InMemorySaver())


def human_interrupt(**allowed: bool) -> dict[str, Any]:
    config = {f"allow_{name}": allowed.get(name, False) for name in ("accept", "edit", "respond", "ignore")}
    return {
        "action_request": {"action": "send_invoice", "args": {"invoice_id": "LG-1", "amount": 900}},
        "config": config,
        "description": "Send invoice LG-1 to ACME?",
    }


def test_an_agent_inbox_interrupt_is_edited_in_the_inbox_and_the_graph_runs_with_the_edit(
    web: Server, grundlag: Client
) -> None:
    graph = graph_of(human_interrupt(accept=True, edit=True, respond=True, ignore=True))
    reviewer = decide_when_asked(
        web,
        approve=True,
        fields={"answer-decision": "edit", "answer-args.invoice_id": "LG-1", "answer-args.amount": "90"},
    )
    result = run_with_inbox(graph, {"heard": []}, {"configurable": {"thread_id": "t-edit"}}, client=grundlag)
    reviewer.join(30)
    assert result["heard"] == [
        {"type": "edit", "args": {"action": "send_invoice", "args": {"invoice_id": "LG-1", "amount": 90}}}
    ]
    (asked,) = list(grundlag.interrupts(status="approved"))
    assert asked.message == "Send invoice LG-1 to ACME?"


def test_the_page_offers_exactly_the_responses_the_interrupt_allows(web: Server, grundlag: Client) -> None:
    graph = graph_of([human_interrupt(accept=True, respond=True)])  # a list, as Agent Inbox sends
    config = {"configurable": {"thread_id": "t-page"}}
    with pytest.raises(TimedOut):
        run_with_inbox(graph, {"heard": []}, config, client=grundlag, timeout=0.5)
    (pending,) = list(grundlag.interrupts(status="pending"))
    reviewer = logged_in_reviewer(web)
    page = reviewer.get(f"/interrupts/{pending.id}/").text
    reviewer.close()
    assert "send_invoice" in page and "LG-1" in page
    offered = re.findall(r'<option value="([a-z]+)"', page)
    assert offered == ["accept", "response"]
    assert 'name="answer-args.amount"' not in page  # no editing where the config allows none
    # Rejected in the inbox: a response with the reviewer's reason, in a list as it was asked.
    reviewer_thread = decide_when_asked(web, approve=False)
    result = run_with_inbox(graph, None, config, client=grundlag)  # the same thread, picked up again
    reviewer_thread.join(30)
    assert result["heard"] == [[{"type": "response", "args": "not this week"}]]
    assert len(list(grundlag.interrupts())) == 1, "picked up again, it asked no second time"


def test_plain_interrupts_are_approvals_and_a_rejection_stops_the_graph_unless_it_takes_one(
    web: Server, grundlag: Client
) -> None:
    graph = graph_of("Ship release 2.3?", {"deploy": "billing", "window": "tonight"})
    config = {"configurable": {"thread_id": "t-plain"}}
    first = decide_when_asked(web, approve=True, fields={"answer-comment": "go"})

    def second_after_first() -> None:  # the second is asked once the first resumed the graph
        first.join(30)
        decide_when_asked(web, approve=False).join(30)

    threading.Thread(target=second_after_first, daemon=True).start()
    # A rejection is not a truthy answer the graph could take for a yes: it raises, and the
    # graph stays where it paused.
    with pytest.raises(Rejected) as rejected:
        run_with_inbox(graph, {"heard": []}, config, client=grundlag, timeout=60)
    assert rejected.value.reason == "not this week"
    assert graph.get_state(config).next == ("ask1",)
    # A graph that handles a no is resumed with it (the same approval: asked no second time).
    result = run_with_inbox(graph, None, config, client=grundlag, resume_rejected=True)
    assert result["heard"][0]["approved"] is True
    assert result["heard"][1] == {"approved": False, "reason": "not this week"}
    asked = {it.message: it for it in grundlag.interrupts()}
    assert set(asked) == {"Ship release 2.3?", "Approve this step?"}


def test_an_async_graph_waits_without_blocking_its_event_loop(web: Server, grundlag: Client) -> None:
    graph = graph_of(human_interrupt(accept=True))
    reviewer = decide_when_asked(web, approve=True, fields={"answer-decision": "accept"})

    async def main() -> tuple[Any, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(tick())
        config = {"configurable": {"thread_id": "t-async"}}
        result = await arun_with_inbox(graph, {"heard": []}, config, client=grundlag)
        ticking.cancel()
        return result, ticks

    result, ticks = asyncio.run(main())
    reviewer.join(30)
    assert result["heard"] == [{"type": "accept", "args": None}]
    assert ticks > 5, "the loop went on while the inbox was asked"


def test_server_mode_asks_returns_and_a_webhook_resumes_the_thread_in_another_graph(site: Site) -> None:
    """ask_inbox asks and returns; the team's run.finished webhook (a real delivery, verified)
    reaches a handler with another graph object on the same checkpointer (another process's),
    which resumes the thread and asks its next question; a webhook delivered again changes
    nothing."""
    site.env["GRUNDLAG_WEBHOOK_ALLOW_PRIVATE"] = "true"
    web = site.serve()
    receiver = Receiver()
    try:
        with Client(web.url, site.token, timeout=10) as api:
            hook = api._request(
                "POST", "/api/webhooks", json={"url": receiver.url, "events": ["run.finished"]}
            )
            saver = InMemorySaver()
            asks = (human_interrupt(accept=True, edit=True), "Ship release 2.3?")
            config = {"configurable": {"thread_id": "t-server"}}
            (first,) = ask_inbox(graph_of(*asks, saver=saver), {"heard": []}, config, client=api)
            assert first.status == "pending" and first.data["langgraph"]["thread_id"] == "t-server"
            assert first.interrupt_id is not None
            decide(web, first.interrupt_id, approve=True, fields={"answer-decision": "accept"})
            (event,) = wait_for(lambda: receiver.verified(hook["secret"]) or None, 20, "the webhook")
            handler_graph = graph_of(*asks, saver=saver)  # what another process compiles
            resumed = resume_from_webhook(handler_graph, event, client=api)
            assert resumed["heard"] == [{"type": "accept", "args": None}]
            assert resume_from_webhook(handler_graph, event, client=api) is None  # sent again
            (second,) = list(api.interrupts(status="pending"))
            assert second.message == "Ship release 2.3?"
            decide(web, second.id, approve=True, fields={"answer-comment": "go"})
            events = wait_for(lambda: receiver.verified(hook["secret"])[1:] or None, 20, "the second")
            done = resume_from_webhook(handler_graph, events[0], client=api)
            assert done["heard"][1]["approved"] is True
            assert handler_graph.get_state(config).next == ()
    finally:
        receiver.stop()
