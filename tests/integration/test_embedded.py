"""`make run`'s arrangement, for real: `manage.py serve` is daphne with its own step threads, on
SQLite. Runs are answered over HTTP and survive the process."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time

import httpx
import pytest

from tests.integration.processes import Site, stop, wait_for

pytestmark = pytest.mark.integration


def test_a_run_pauses_and_is_answered_over_http_through_the_embedded_worker(site: Site) -> None:
    token = site.token
    with site.serve().client(token) as api:
        started = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": "INV-7", "amount": 70}},
            headers={"Prefer": "wait=20"},
        )
        assert started.status_code == 200, started.text
        run = started.json()
        assert run["status"] == "interrupted"
        pending = api.get("/api/interrupts", params={"status": "pending"}).json()["items"]
        assert [p["id"] for p in pending] == [run["interrupt"]["id"]]

        resumed = api.post(
            run["interrupt"]["resume_url"], json={"data": {"approved": True}}, headers={"Prefer": "wait=20"}
        )
        assert resumed.status_code == 200
        assert resumed.json()["status"] == "completed"
        assert resumed.json()["output"] == {
            "sent": True,
            "invoice_id": "INV-7",
            "approved_by_answer": {"approved": True},
        }
        # The served application answers its orchestrator's probe (at its edge, actions.web.health).
        live = api.get("/healthz")
        assert (live.status_code, live.text) == (200, "ok\n")


def test_without_prefer_wait_a_queued_run_is_202_and_settles_later(site: Site) -> None:
    token = site.token
    with site.serve().client(token) as api:
        response = api.post(
            "/api/runs", json={"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}}
        )
        assert response.status_code in (200, 202)
        run_id = response.json()["id"]
        deadline = time.monotonic() + 20
        while api.get(f"/api/runs/{run_id}").json()["status"] != "interrupted":
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_pending_interrupts_survive_a_restart_and_resume_in_a_fresh_process(site: Site) -> None:
    token = site.token
    # transfer_funds separates duties; this team lets its API caller answer its own runs.
    site.manage(
        "shell",
        "-c",
        "from actions.models import Policy, Team; Policy.objects.create("
        "team=Team.objects.get(slug='demo'), action='transfer_funds', requester_may_approve=True)",
    )
    first = site.serve()
    with first.client(token) as api:
        run = api.post(
            "/api/runs",
            json={"action": "transfer_funds", "input": {"amount": 5000, "to": "DE12"}},
            headers={"Prefer": "wait=20"},
        ).json()
        second = api.post(
            run["interrupt"]["resume_url"],
            json={"data": {"approved": True, "n": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
        assert second["interrupt"]["seq"] == 2
    assert stop(first.proc, signal.SIGTERM) == 0, "serve stops cleanly on SIGTERM"

    with site.serve().client(token) as api:
        detail = api.get(f"/api/runs/{run['id']}").json()
        assert detail["status"] == "interrupted" and detail["interrupt"]["id"] == second["interrupt"]["id"]
        done = api.post(
            f"/api/interrupts/{second['interrupt']['id']}/resume",
            json={"data": {"approved": True, "n": 2}},
            headers={"Prefer": "wait=20"},
        ).json()
        # The first answer came back from the checkpoint stored before the restart.
        assert done["status"] == "completed"
        assert done["output"]["answers"] == [{"approved": True, "n": 1}, {"approved": True, "n": 2}]


def test_sigterm_answers_the_requests_waiting_on_a_run_and_stops_at_once(site: Site) -> None:
    """A request still waiting (`Prefer: wait=30` on an approval) when SIGTERM comes is answered
    with the approval as it is, and does not keep the process alive until its supervisor kills
    it."""
    server = site.serve()
    answers: list[httpx.Response | Exception] = []

    def ask() -> None:
        with server.client(site.token) as api:
            try:
                answers.append(
                    api.post("/api/approvals", json={"message": "ship it?"}, headers={"Prefer": "wait=30"})
                )
            except Exception as exc:  # what must not happen: the connection closed under it
                answers.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    wait_for(lambda: site.sql("SELECT COUNT(*) FROM actions_interrupt")[0][0] == 1, 20, "the approval")
    time.sleep(0.5)  # the request is waiting
    started = time.monotonic()
    assert stop(server.proc, signal.SIGTERM, timeout=20) == 0
    assert time.monotonic() - started < 4.5  # not held the drain's 5 s
    asking.join(10)
    (answer,) = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 202 and answer.json()["status"] == "pending", answer.text
    # Still pending in the inbox, for the next start.
    assert site.sql("SELECT status FROM actions_interrupt") == [("pending",)]


def test_a_step_left_running_by_a_crashed_process_is_run_again_at_start(site: Site) -> None:
    token = site.token
    server = site.serve()
    with server.client(token) as api:
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": "A", "amount": 1}},
            headers={"Prefer": "wait=20"},
        ).json()
    stop(server.proc, signal.SIGKILL)
    # As a crash mid-step leaves it: the run claimed, its step never recorded.
    db = sqlite3.connect(site.env["DATABASE_URL"].removeprefix("sqlite:///"))
    with db:
        db.execute("DELETE FROM actions_runevent WHERE run_id = ? AND kind != 'started'", (run["id"],))
        db.execute("DELETE FROM actions_interrupt WHERE run_id = ?", (run["id"],))
        db.execute("UPDATE actions_run SET status = 'running', attempt = 1 WHERE id = ?", (run["id"],))
    db.close()

    with site.serve().client(token) as api:
        deadline = time.monotonic() + 20
        while (detail := api.get(f"/api/runs/{run['id']}").json())["status"] != "interrupted":
            assert time.monotonic() < deadline, detail
            time.sleep(0.05)
        assert len(detail["transcript"]) == 1


def test_an_agent_conversation_survives_a_restart_between_pause_and_answer(site: Site) -> None:
    turns = [
        {"tool_calls": [{"id": "look", "name": "lookup_customer", "arguments": {"customer_id": "c1"}}]},
        {
            "tool_calls": [
                {"id": "send", "name": "send_invoice", "arguments": {"invoice_id": "R-1", "amount": 9}}
            ]
        },
        {"content": "Invoice R-1 is out."},
    ]
    first = site.serve()
    with first.client(site.token) as api:
        run = api.post(
            "/api/agents/runs",
            json={
                "messages": [{"role": "user", "content": "bill c1"}],
                "tools": ["lookup_customer", "send_invoice"],
                "model": {"scripted": turns},
            },
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted" and run["interrupt"]["tool_call_id"] == "send"
    stop(first.proc, signal.SIGTERM)

    with site.serve().client(site.token) as api:
        # Not the absolute resume_url: that names the stopped server's port.
        resume = f"/api/interrupts/{run['interrupt']['id']}/resume"
        done = api.post(resume, json={"data": {"approved": True}}, headers={"Prefer": "wait=20"})
        assert (done.json()["status"], done.json()["output"]) == ("completed", "Invoice R-1 is out.")
        messages = api.get(f"/api/agents/runs/{run['id']}").json()["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in messages] == [
        ("user", None),
        ("assistant", None),
        ("tool", "look"),
        ("assistant", None),
        ("tool", "send"),
        ("assistant", None),
    ]


def test_a_paused_script_survives_a_restart_and_replays_from_its_log(site: Site) -> None:
    source = (
        "customer = tools.lookup_customer(customer_id=input['customer'])\n"
        "sent = tools.send_invoice(invoice_id='R-9', amount=9)\n"
        "return {'name': customer['name'], 'sent': sent['sent']}\n"
    )
    first = site.serve()
    with first.client(site.token) as api:
        run = api.post(
            "/api/scripts/runs",
            json={"source": source, "input": {"customer": "c9"}},
            headers={"Prefer": "wait=20"},
        ).json()
    assert run["status"] == "interrupted"
    stop(first.proc, signal.SIGTERM)

    with site.serve().client(site.token) as api:
        resume = f"/api/interrupts/{run['interrupt']['id']}/resume"
        done = api.post(resume, json={"data": {"approved": True}}, headers={"Prefer": "wait=20"}).json()
        assert done["status"] == "completed", done
        assert done["output"] == {"name": "Customer 156", "sent": True}
        log = api.get(f"/api/scripts/runs/{run['id']}").json()["call_log"]
    assert [entry["action"] for entry in log] == ["lookup_customer", "send_invoice"]
