"""A LangGraph graph's Agent Inbox interrupt, decided by a reviewer in Chromium: the page shows
the action and its arguments and offers exactly the responses its config allows; the
reviewer chooses "edit", changes an argument, approves, and the graph resumes with that edit
(grundlag_client.langgraph, against `make run`'s server)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from grundlag_client import Client
from grundlag_client.langgraph import run_with_inbox
from tests.integration.browser.conftest import log_in
from tests.integration.browser.test_inbox_live import screenshot_dir
from tests.integration.processes import Site
from tests.integration.test_langgraph import graph_of, human_interrupt

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_a_reviewer_edits_an_agent_inbox_call_in_the_browser_and_the_graph_runs_it(
    site: Site, browser: Browser, tmp_path: Path
) -> None:
    server = site.serve()
    graph = graph_of(human_interrupt(accept=True, edit=True, ignore=True))
    finished: list[Any] = []

    def run_graph() -> None:
        with Client(server.url, site.token, timeout=10) as client:
            config = {"configurable": {"thread_id": "browser-edit"}}
            finished.append(run_with_inbox(graph, {"heard": []}, config, client=client, timeout=60))

    running = threading.Thread(target=run_graph, daemon=True)
    running.start()
    page = log_in(browser, server.url, "reviewer1")
    row = page.locator("#inbox-rows > tr").first
    expect(row).to_contain_text("Send invoice LG-1 to ACME?")
    row.click()
    expect(page.locator("main")).to_contain_text("send_invoice")
    decision = page.locator('select[name="answer-decision"]')
    expect(decision.locator("option")).to_have_text(["accept", "edit", "ignore"])
    expect(page.locator('[name="answer-response"]')).to_have_count(0)  # not allowed: not offered
    amount = page.locator('[name="answer-args.amount"]')
    expect(amount).to_have_value("900")
    decision.select_option("edit")
    amount.fill("90")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "agent-inbox.png"), full_page=True)
    page.locator("form.approve-form button.approve").click()
    expect(page.locator("p.decided")).to_contain_text("Already approved by reviewer1")
    running.join(30)
    (result,) = finished
    assert result["heard"] == [
        {"type": "edit", "args": {"action": "send_invoice", "args": {"invoice_id": "LG-1", "amount": 90}}}
    ]


def test_a_reviewer_edits_a_pydantic_ai_call_and_rejects_an_openai_agents_call_in_the_browser(
    site: Site, browser: Browser
) -> None:
    """PydanticAI's deferred tool call, its amount edited in Chromium, runs with the edit; the
    OpenAI Agents SDK's tool call, rejected in Chromium with a reason, never runs, and the model
    reads the reason."""
    from agents import Agent as OpenAIAgent
    from agents import function_tool, set_tracing_disabled

    from grundlag_client import openai_agents, pydantic_ai
    from tests.integration.test_agent_frameworks import ProposesThenReports, biller

    set_tracing_disabled(True)
    server = site.serve()
    agent, sent = biller()
    finished: list[Any] = []

    def run(adapter: Any, agent: Any) -> threading.Thread:
        def go() -> None:
            with Client(server.url, site.token, timeout=10) as client:
                finished.append(adapter.run_with_inbox(agent, "bill ACME", client=client, timeout=60))

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        return thread

    running = run(pydantic_ai, agent)
    page = log_in(browser, server.url, "reviewer1")
    row = page.locator("#inbox-rows > tr").first
    expect(row).to_contain_text("biller wants to call send_invoice?")
    row.click()
    amount = page.locator('[name="answer-amount"]')
    expect(amount).to_have_value("900")
    amount.fill("90")
    page.locator("form.approve-form button.approve").click()
    expect(page.locator("p.decided")).to_contain_text("Already approved by reviewer1")
    running.join(30)
    assert sent == [{"invoice_id": "AF-1", "amount": 90}]
    assert finished.pop().output == "tool said: sent AF-1 for 90"

    called: list[Any] = []

    @function_tool(needs_approval=True)
    def send_invoice(invoice_id: str, amount: int) -> str:
        """Send an invoice."""
        called.append(invoice_id)
        return "sent"

    running = run(
        openai_agents, OpenAIAgent(name="Biller", model=ProposesThenReports(), tools=[send_invoice])
    )
    page.goto("/")
    row = page.locator("#inbox-rows > tr").first
    expect(row).to_contain_text("Biller wants to call send_invoice?")
    row.click()
    page.locator("details.reject summary, summary:has-text('Reject')").first.click()
    page.fill('[name="reject-reason"]', "wrong customer")
    page.locator("form.reject-form button").first.click()
    expect(page.locator("p.decided")).to_contain_text("rejected")
    running.join(30)
    assert called == [] and finished.pop().final_output == "tool said: wrong customer"
