"""The agent consumer: the loop over tool calls, pauses on tool calls, resume and reject, and the
OpenAI wire format against a small OpenAI-compatible server started by the test."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from actions import engine
from actions.drivers.agent import start_agent
from actions.models import Interrupt, Run, Team

# Runs with steps in workers and inline, on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("steps", "database")]


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def agent(team: Team, turns: list[dict[str, Any]], tools: list[str]) -> Run:
    run = start_agent([{"role": "user", "content": "go"}], tools, {"scripted": turns}, team, None)
    run.refresh_from_db()
    return run


def test_an_agent_without_tool_calls_completes_with_the_last_message(team: Team) -> None:
    run = agent(team, [{"content": "Nothing to do."}], [])
    assert (run.status, run.output) == ("completed", "Nothing to do.")
    assert [m["role"] for m in run.driver_state["messages"]] == ["user", "assistant"]


def test_a_pausing_tool_call_stops_the_loop_and_resume_continues_it(team: Team, reviewer: User) -> None:
    run = agent(
        team,
        [
            {"content": "sending", "tool_calls": [call("c1", "send_invoice", invoice_id="I-1", amount=5)]},
            {"content": "sent it"},
        ],
        ["send_invoice"],
    )
    assert run.status == "interrupted"
    interrupt = run.interrupts.get()
    assert (interrupt.tool_call_id, interrupt.action, interrupt.message) == (
        "c1",
        "send_invoice",
        "Approve sending the invoice?",
    )

    engine.resume(interrupt, {"approved": True}, reviewer)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", "sent it")
    roles = [(m["role"], m.get("tool_call_id")) for m in run.driver_state["messages"]]
    assert roles == [("user", None), ("assistant", None), ("tool", "c1"), ("assistant", None)]
    result = json.loads(run.driver_state["messages"][2]["content"])
    assert result == {"sent": True, "invoice_id": "I-1", "approved_by_answer": {"approved": True}}


def test_a_rejected_tool_call_is_an_error_the_model_sees_and_the_loop_goes_on(
    team: Team, reviewer: User
) -> None:
    run = agent(
        team,
        [
            {"tool_calls": [call("c1", "transfer_funds", amount=50, to="X")]},
            {"content": "Understood, I will not transfer."},
        ],
        ["transfer_funds"],
    )
    engine.reject(run.interrupts.get(), "not this month", reviewer)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", "Understood, I will not transfer.")
    tool_message = run.driver_state["messages"][2]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "error: rejected by reviewer1: not this month",
    }
    # The model's next turn came after the error: it was part of what the model was given.
    assert run.driver_state["messages"][3]["role"] == "assistant"


def test_parallel_calls_keep_finished_results_and_wait_for_every_pause(
    team: Team, reviewer: User, second_reviewer: User, ran: list[str]
) -> None:
    run = agent(
        team,
        [
            {
                "tool_calls": [
                    call("a", "noted", text="once"),
                    call("b", "send_invoice", invoice_id="I-2", amount=7),
                    call("c", "transfer_funds", amount=20, to="Y"),
                ]
            },
            {"content": "all three done"},
        ],
        ["noted", "send_invoice", "transfer_funds"],
    )
    pending = {it.tool_call_id: it for it in run.interrupts.filter(status="pending")}
    assert set(pending) == {"b", "c"} and run.status == "interrupted"
    assert ran == ["once"]

    engine.resume(pending["b"], {"approved": True}, reviewer)
    run.refresh_from_db()
    assert run.status == "interrupted", "still waiting for the second pause"
    engine.resume(pending["c"], {"approved": True}, second_reviewer)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", "all three done")
    assert ran == ["once"], "the finished call was not run again"
    tools = [m for m in run.driver_state["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["a", "b", "c"]
    assert json.loads(tools[2]["content"]) == {"transferred": True, "answers": [{"approved": True}]}
    assert run.events.filter(kind="claimed").count() == 2


def test_bad_tool_calls_become_error_results(team: Team) -> None:
    run = agent(
        team,
        [
            {"tool_calls": [call("x", "rm_rf", path="/"), call("y", "send_invoice", amount="lots")]},
            {"content": "ok"},
        ],
        ["send_invoice"],
    )
    tools = [m["content"] for m in run.driver_state["messages"] if m["role"] == "tool"]
    assert tools[0] == "error: there is no tool named 'rm_rf'"
    assert tools[1].startswith("error: invalid input: invoice_id: Field required")


def billing_agent_via_api(client: Client) -> dict[str, Any]:
    """An agent started through the API: its one tool call (send_invoice, id t1) pauses, and
    once it is answered the model says "billed"."""
    body = {
        "messages": [{"role": "user", "content": "bill them"}],
        "tools": ["send_invoice"],
        "model": {
            "scripted": [
                {"tool_calls": [call("t1", "send_invoice", invoice_id="I", amount=1)]},
                {"content": "billed"},
            ]
        },
    }
    started: dict[str, Any] = client.post(
        "/api/agents/runs", json.dumps(body), content_type="application/json"
    ).json()
    return started


def test_the_agent_api_starts_a_run_and_answers_through_the_interrupt_endpoints(
    team: Team, token_key: str
) -> None:
    client = Client(headers={"Authorization": f"Bearer {token_key}", "Prefer": "wait=5"})
    started = billing_agent_via_api(client)
    assert started["status"] == "interrupted" and started["interrupt"]["tool_call_id"] == "t1"
    done = client.post(
        started["interrupt"]["resume_url"].removeprefix("http://testserver"),
        json.dumps({"data": {"approved": True}}),
        content_type="application/json",
    ).json()
    assert (done["status"], done["output"]) == ("completed", "billed")
    detail = client.get(f"/api/agents/runs/{started['id']}").json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert client.get(f"/api/agents/runs/{started['id'] + 1000}").status_code == 404


def test_unknown_tools_and_models_are_refused(team: Team, token_key: str) -> None:
    client = Client(headers={"Authorization": f"Bearer {token_key}"})
    body = {"messages": [{"role": "user", "content": "x"}], "tools": ["nope"], "model": {"scripted": []}}
    response = client.post("/api/agents/runs", json.dumps(body), content_type="application/json")
    assert response.status_code == 404 and "nope" in response.json()["detail"]
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [], "model": "gpt-unknown"}
    response = client.post("/api/agents/runs", json.dumps(body), content_type="application/json")
    assert response.status_code == 422 and "unknown model 'gpt-unknown'" in response.json()["detail"]
    assert not Run.objects.exists()


def test_the_run_page_shows_the_conversation_with_the_suspended_call_and_its_form(
    team: Team, reviewer: User
) -> None:
    run = agent(
        team,
        [
            {
                "content": "about to send",
                "tool_calls": [call("c9", "send_invoice", invoice_id="INV-C9", amount=99)],
            }
        ],
        ["send_invoice"],
    )
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'class="tool-call suspended" id="call-c9"' in page
    assert "INV-C9" in page and "Paused: Approve sending the invoice?" in page
    interrupt = run.interrupts.get()
    assert f'hx-post="/interrupts/{interrupt.pk}/approve/"' in page


# The OpenAI wire format, against a server that speaks it.


class FakeOpenAI(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []
    replies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        message = type(self).replies[len(type(self).requests) - 1]
        payload = {
            "id": f"chatcmpl-{len(type(self).requests)}",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def openai_server(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeOpenAI]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    monkeypatch.setenv("LOCAL_TEST_KEY", "sk-local-test")
    settings.GRUNDLAG_MODELS = {
        "local": {
            "base_url": f"http://127.0.0.1:{server.server_address[1]}/v1",
            "model": "qwen-test",
            "api_key_env": "LOCAL_TEST_KEY",
        }
    }
    FakeOpenAI.requests = []
    yield FakeOpenAI
    server.shutdown()


def test_the_openai_client_speaks_the_real_wire_format(
    openai_server: type[FakeOpenAI], team: Team, reviewer: User
) -> None:
    openai_server.replies = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {
                        "name": "send_invoice",
                        "arguments": '{"invoice_id": "W-1", "amount": 12.5}',
                    },
                }
            ],
        },
        {"role": "assistant", "content": "The invoice is sent."},
    ]
    run = start_agent([{"role": "user", "content": "send W-1"}], ["send_invoice"], "local", team, None)
    run.refresh_from_db()
    assert run.status == "interrupted" and run.interrupts.get().tool_call_id == "call_abc"
    engine.resume(run.interrupts.get(), {"approved": True}, reviewer)
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", "The invoice is sent.")

    first, second = openai_server.requests
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer sk-local-test"
    assert first["body"]["model"] == "qwen-test"
    tool = first["body"]["tools"][0]
    assert tool["type"] == "function" and tool["function"]["name"] == "send_invoice"
    assert tool["function"]["parameters"]["required"] == ["invoice_id", "amount"]
    assistant, tool_result = second["body"]["messages"][1:]
    assert assistant["tool_calls"][0]["id"] == "call_abc"
    assert tool_result["role"] == "tool" and tool_result["tool_call_id"] == "call_abc"
    assert json.loads(tool_result["content"])["invoice_id"] == "W-1"
    assert "sk-local-test" not in json.dumps(run.driver_state) + json.dumps(run.input)


def test_a_model_server_that_is_down_fails_the_run_clearly(settings: Any, team: Team) -> None:
    settings.GRUNDLAG_MODELS = {"local": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}
    run = start_agent([{"role": "user", "content": "x"}], [], "local", team, None)
    run.refresh_from_db()
    assert run.status == "failed" and run.error.startswith("the model server refused or failed")
    assert not Interrupt.objects.filter(run=run).exists()


# Editing a tool call before approving it (as LangGraph's Agent Inbox does).


def test_a_call_approved_with_edited_arguments_runs_with_them_and_the_model_sees_the_edit(
    openai_server: type[FakeOpenAI], team: Team, reviewer: User
) -> None:
    openai_server.replies = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_e1",
                    "type": "function",
                    "function": {
                        "name": "send_invoice",
                        "arguments": '{"invoice_id": "W-1", "amount": 1250}',
                    },
                }
            ],
        },
        {"role": "assistant", "content": "Sent, as corrected."},
    ]
    run = start_agent([{"role": "user", "content": "send W-1"}], ["send_invoice"], "local", team, None)
    interrupt = run.interrupts.get()
    assert engine.proposed_arguments(interrupt) == {"invoice_id": "W-1", "amount": 1250}

    engine.resume(interrupt, {"approved": True}, reviewer, arguments={"invoice_id": "W-1B", "amount": "125"})
    run.refresh_from_db()
    assert (run.status, run.output) == ("completed", "Sent, as corrected.")
    # The tool ran with the edit, and the model was told its call was the edited one.
    _, second = openai_server.requests
    assistant, result = second["body"]["messages"][1:]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
        "invoice_id": "W-1B",
        "amount": 125.0,
    }
    assert json.loads(result["content"])["invoice_id"] == "W-1B"
    # The transcript and the audit keep both.
    interrupt.refresh_from_db()
    assert interrupt.edited_arguments == {"invoice_id": "W-1B", "amount": 125.0}
    approved = run.events.get(kind="approved")
    assert approved.detail["edited"] == {
        "from": {"invoice_id": "W-1", "amount": 1250},
        "to": {"invoice_id": "W-1B", "amount": 125.0},
    }


def test_an_edit_that_does_not_fit_the_tool_or_changes_nothing_or_is_not_a_tool_call(
    team: Team, reviewer: User
) -> None:
    run = agent(
        team,
        [{"tool_calls": [call("c1", "send_invoice", invoice_id="I-1", amount=5)]}, {"content": "ok"}],
        ["send_invoice"],
    )
    interrupt = run.interrupts.get()
    with pytest.raises(engine.InvalidInput) as refused:
        engine.resume(interrupt, {"approved": True}, reviewer, arguments={"invoice_id": "I-1", "amount": -5})
    assert refused.value.errors[0]["loc"] == ["amount"]
    interrupt.refresh_from_db()
    assert interrupt.status == "pending"
    # The same arguments, however typed, are no edit.
    engine.resume(interrupt, {"approved": True}, reviewer, arguments={"invoice_id": "I-1", "amount": "5"})
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.edited_arguments) == ("approved", None)
    assert "edited" not in run.events.get(kind="approved").detail

    plain = engine.start_run("send_invoice", {"invoice_id": "I-2", "amount": 1}, team, None).interrupts.get()
    assert engine.proposed_arguments(plain) is None
    with pytest.raises(engine.InvalidInput, match="only a pending tool call"):
        engine.resume(plain, {"approved": True}, reviewer, arguments={"invoice_id": "I-3", "amount": 1})
    plain.refresh_from_db()
    assert plain.status == "pending"


def test_a_reviewer_edits_the_call_on_its_page_and_the_run_page_shows_both(
    team: Team, reviewer: User
) -> None:
    run = agent(
        team,
        [{"tool_calls": [call("c1", "send_invoice", invoice_id="INV-7", amount=700)]}, {"content": "done"}],
        ["send_invoice"],
    )
    interrupt = run.interrupts.get()
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/interrupts/{interrupt.pk}/").content.decode()
    assert "Edit the call before approving" in page
    assert 'name="edit-invoice_id"' in page and 'value="INV-7"' in page and 'value="700"' in page

    bad = client.post(
        f"/interrupts/{interrupt.pk}/approve/", {"edit": "1", "edit-invoice_id": "INV-7", "edit-amount": "-1"}
    )
    assert bad.status_code == 422
    assert re.search(
        r"<ul class=\"errorlist\" id=\"id_edit-amount_error\"><li>Input should be greater than 0",
        bad.content.decode(),
    )
    interrupt.refresh_from_db()
    assert interrupt.status == "pending"

    done = client.post(
        f"/interrupts/{interrupt.pk}/approve/",
        {"edit": "1", "edit-invoice_id": "INV-7", "edit-amount": "70"},
        follow=True,
    )
    assert "with the arguments as you edited them" in done.content.decode()
    run.refresh_from_db()
    assert run.status == "completed"
    tool_result = json.loads(run.driver_state["messages"][2]["content"])
    assert tool_result["invoice_id"] == "INV-7"
    sent = json.loads(run.driver_state["messages"][1]["tool_calls"][0]["function"]["arguments"])
    assert sent == {"invoice_id": "INV-7", "amount": 70.0}
    run_page = client.get(f"/runs/{run.pk}/").content.decode()
    edited = re.search(r'<div class="edited">(.*?)</div></div>', run_page, re.S)
    assert edited is not None and "the model proposed" in edited.group(1)
    proposed, ran = re.findall(r"<dt>amount</dt><dd><code>([^<]+)</code>", edited.group(1))
    assert (proposed, ran) == ("700", "70.0")
    assert "edited them before approving" in run_page


def test_an_approval_without_the_edit_ticked_runs_the_call_as_proposed_whatever_the_fields_hold(
    team: Team, reviewer: User
) -> None:
    run = agent(
        team,
        [{"tool_calls": [call("c1", "send_invoice", invoice_id="INV-8", amount=80)]}, {"content": "done"}],
        ["send_invoice"],
    )
    interrupt = run.interrupts.get()
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/interrupts/{interrupt.pk}/").content.decode()
    assert '<input type="checkbox" name="edit" value="1">' in page, "not ticked until the reviewer edits"
    # What a browser posts for a plain Approve: the fields as they are (here, changed), no tick.
    client.post(f"/interrupts/{interrupt.pk}/approve/", {"edit-invoice_id": "INV-8 ", "edit-amount": "8"})
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.edited_arguments) == ("approved", None)
    sent = json.loads(
        Run.objects.get(pk=run.pk).driver_state["messages"][1]["tool_calls"][0]["function"]["arguments"]
    )
    assert sent == {"invoice_id": "INV-8", "amount": 80}


def test_an_edit_changes_only_the_fields_the_reviewer_changed_and_is_refused_where_none_is_offered(
    team: Team, reviewer: User
) -> None:
    run = agent(
        team,
        [{"tool_calls": [call("c1", "send_invoice", invoice_id="  INV-9\n", amount=90)]}, {"content": "ok"}],
        ["send_invoice"],
    )
    interrupt = run.interrupts.get()
    client = Client()
    client.force_login(reviewer)
    # A browser sends the untouched text field trimmed of its newline; only the amount was edited.
    client.post(
        f"/interrupts/{interrupt.pk}/approve/", {"edit": "1", "edit-invoice_id": "INV-9", "edit-amount": "9"}
    )
    interrupt.refresh_from_db()
    assert interrupt.edited_arguments == {"invoice_id": "  INV-9\n", "amount": 9.0}

    plain = engine.start_run("send_invoice", {"invoice_id": "P-1", "amount": 1}, team, None).interrupts.get()
    refused = client.post(f"/interrupts/{plain.pk}/approve/", {"edit": "1", "edit-amount": "2"})
    assert refused.status_code == 422
    assert "Not approved: this call&#x27;s arguments cannot be edited." in refused.content.decode()
    plain.refresh_from_db()
    assert plain.status == "pending"


def test_text_with_a_nul_character_is_refused_as_an_edit_or_an_answer(team: Team, token_key: str) -> None:
    run = agent(
        team,
        [{"tool_calls": [call("c1", "send_invoice", invoice_id="N-1", amount=1)]}, {"content": "ok"}],
        ["send_invoice"],
    )
    url = f"/api/interrupts/{run.interrupts.get().pk}/resume"
    client = Client(headers={"Authorization": f"Bearer {token_key}"})
    for body in ('{"arguments": {"invoice_id": "N\\u0000", "amount": 1}}', '{"data": {"note": "a\\u0000"}}'):
        refused = client.post(url, body, content_type="application/json")
        assert refused.status_code == 422, refused.content
        assert "NUL character" in refused.json()["detail"][0]["msg"], refused.json()
    assert run.interrupts.get().status == "pending"


def test_only_a_calls_first_pause_can_be_edited(team: Team, reviewer: User) -> None:
    """A second pause of the same call resumes a checkpoint made with the arguments it has."""
    run = agent(
        team,
        [{"tool_calls": [call("c1", "transfer_funds", amount=5000, to="DE1")]}, {"content": "moved"}],
        ["transfer_funds"],
    )
    first = run.interrupts.get()
    engine.resume(first, {"approved": True}, reviewer, arguments={"amount": 1500, "to": "DE1"})
    run.refresh_from_db()
    second = run.interrupts.get(status="pending")
    assert second.message.startswith("Second confirmation: 1,500.00 EUR")
    assert engine.proposed_arguments(second) is None
    with pytest.raises(engine.InvalidInput, match="at its first pause"):
        engine.resume(second, {"approved": True}, reviewer, arguments={"amount": 10, "to": "DE1"})
    client = Client()
    client.force_login(reviewer)
    assert "Edit the call before approving" not in client.get(f"/interrupts/{second.pk}/").content.decode()
    engine.resume(second, {"approved": True}, reviewer)
    run.refresh_from_db()
    assert run.status == "completed"
    result = json.loads(run.driver_state["messages"][2]["content"])
    assert result["transferred"] is True and len(result["answers"]) == 2


def test_the_api_approves_a_call_with_edited_arguments(team: Team, token_key: str) -> None:
    client = Client(headers={"Authorization": f"Bearer {token_key}", "Prefer": "wait=5"})
    started = billing_agent_via_api(client)
    url = started["interrupt"]["resume_url"].removeprefix("http://testserver")
    refused = client.post(url, json.dumps({"arguments": {"amount": 2}}), content_type="application/json")
    assert refused.status_code == 422 and "invoice_id" in refused.content.decode()
    done = client.post(
        url,
        json.dumps({"data": {"approved": True}, "arguments": {"invoice_id": "I-9", "amount": 2}}),
        content_type="application/json",
    ).json()
    assert done["status"] == "completed"
    detail = client.get(f"/api/agents/runs/{started['id']}").json()
    assert detail["transcript"][0]["edited_arguments"] == {"invoice_id": "I-9", "amount": 2.0}
    assert json.loads(detail["messages"][2]["content"])["invoice_id"] == "I-9"
