"""The OpenAI Agents SDK and PydanticAI (the real packages, with a scripted model each: no LLM)
with the team's inbox, through the Python client's adapters, against `make run`'s server: a
tool call that needs approval is asked in the inbox, a reviewer decides it on its page as a
browser would (approves, edits, rejects), and the framework's run ends with exactly that."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent as OpenAIAgent
from agents import ModelResponse as OpenAIResponse
from agents import Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from grundlag_client import Client
from grundlag_client import openai_agents as with_openai_agents
from grundlag_client import pydantic_ai as with_pydantic_ai
from tests.integration.processes import Server, decide_when_asked

pytestmark = pytest.mark.integration

CALL = {"invoice_id": "AF-1", "amount": 900}


# PydanticAI: FunctionModel proposes the call, then says what the tool returned.


def proposes_then_reports(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
    if returned:
        return ModelResponse(parts=[TextPart(f"tool said: {returned[0].content}")])
    return ModelResponse(parts=[ToolCallPart("send_invoice", dict(CALL), tool_call_id="c1")])


def biller() -> tuple[Agent[None, Any], list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    agent: Agent[None, Any] = Agent(
        FunctionModel(proposes_then_reports), output_type=[str, DeferredToolRequests], name="biller"
    )

    @agent.tool_plain(requires_approval=True)
    def send_invoice(invoice_id: str, amount: int) -> str:
        """Send an invoice."""
        sent.append({"invoice_id": invoice_id, "amount": amount})
        return f"sent {invoice_id} for {amount}"

    return agent, sent


def test_pydantic_ai_runs_the_call_with_the_arguments_the_reviewer_edited(
    web: Server, grundlag: Client
) -> None:
    agent, sent = biller()
    reviewer = decide_when_asked(
        web, approve=True, fields={"answer-invoice_id": "AF-1", "answer-amount": "90"}
    )
    result = with_pydantic_ai.run_with_inbox(agent, "bill ACME", client=grundlag, timeout=60)
    reviewer.join(30)
    assert sent == [{"invoice_id": "AF-1", "amount": 90}]
    assert result.output == "tool said: sent AF-1 for 90"
    (asked,) = list(grundlag.interrupts())
    assert asked.message == "biller wants to call send_invoice?"
    assert asked.data == {"tool": "send_invoice", "arguments": CALL, "agent": "biller"}


def test_pydantic_ai_approved_as_proposed_and_rejected_with_the_reason(web: Server, grundlag: Client) -> None:
    agent, sent = biller()
    reviewer = decide_when_asked(
        web, approve=True, fields={"answer-invoice_id": "AF-1", "answer-amount": "900"}
    )
    result = with_pydantic_ai.run_with_inbox(agent, "bill ACME", client=grundlag, timeout=60)
    reviewer.join(30)
    assert sent == [CALL] and result.output == "tool said: sent AF-1 for 900"
    reviewer = decide_when_asked(web, approve=False)
    result = with_pydantic_ai.run_with_inbox(agent, "bill ACME", client=grundlag, timeout=60)
    reviewer.join(30)
    assert sent == [CALL], "a rejected call never runs"
    assert result.output == "tool said: not this week"


# The OpenAI Agents SDK: the SDK's own model interface, scripted the same way.


class ProposesThenReports(Model):
    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        items = input if isinstance(input, list) else []
        returned = [
            item for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if returned:
            text = ResponseOutputText(
                type="output_text", text=f"tool said: {returned[-1]['output']}", annotations=[]
            )
            message = ResponseOutputMessage(
                id="m1", type="message", role="assistant", status="completed", content=[text]
            )
            return OpenAIResponse(output=[message], usage=Usage(), response_id=None)
        call = ResponseFunctionToolCall(
            id="f1", type="function_call", call_id="call_1", name="send_invoice", arguments=json.dumps(CALL)
        )
        return OpenAIResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "rejected"])
def test_openai_agents_runs_the_call_only_when_approved(web: Server, grundlag: Client, approve: bool) -> None:
    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI
    sent: list[dict[str, Any]] = []

    @function_tool(needs_approval=True)
    def send_invoice(invoice_id: str, amount: int) -> str:
        """Send an invoice."""
        sent.append({"invoice_id": invoice_id, "amount": amount})
        return f"sent {invoice_id} for {amount}"

    agent = OpenAIAgent(name="Biller", model=ProposesThenReports(), tools=[send_invoice])
    reviewer = decide_when_asked(web, approve=approve)
    result = with_openai_agents.run_with_inbox(agent, "bill ACME", client=grundlag, timeout=60)
    reviewer.join(30)
    (asked,) = list(grundlag.interrupts())
    assert asked.message == "Biller wants to call send_invoice?"
    assert asked.data["arguments"] == CALL
    if approve:
        assert sent == [CALL] and result.final_output == "tool said: sent AF-1 for 900"
    else:
        assert sent == [] and result.final_output == "tool said: not this week"
