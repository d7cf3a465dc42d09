"""The Python client (clients/python) against `make run`'s server (daphne with its own step
threads, on SQLite): approvals asked and decided by a reviewer in the browser's way, runs
started and answered, lists paged, and retries after a lost answer that change nothing twice."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import httpx
import pytest

from grundlag_client import Client, Rejected, TimedOut, requires_approval
from tests.integration.processes import Server, Site, decide_when_asked

pytestmark = pytest.mark.integration


SCHEMA = {
    "type": "object",
    "properties": {"window": {"type": "string", "enum": ["tonight", "weekend"]}},
    "required": ["window"],
}


def test_request_approval_blocks_until_a_reviewer_answers(web: Server, grundlag: Client) -> None:
    reviewer = decide_when_asked(web, approve=True, fields={"answer-window": "tonight"})
    answer = grundlag.request_approval(
        "Deploy billing 2.3?", {"service": "billing"}, answer_schema=SCHEMA, timeout=30
    )
    reviewer.join(30)
    assert answer == {"window": "tonight"}


def test_a_rejection_raises_with_the_reviewers_reason(web: Server, grundlag: Client) -> None:
    reviewer = decide_when_asked(web, approve=False)
    with pytest.raises(Rejected) as rejected:
        grundlag.request_approval("Rotate the signing key?", timeout=30)
    reviewer.join(30)
    assert rejected.value.status == "rejected" and rejected.value.reason == "not this week"


def test_the_decorator_runs_the_function_only_once_approved(web: Server, grundlag: Client) -> None:
    refunded: list[tuple[str, int, Any]] = []

    @requires_approval(grundlag, "Refund {amount} EUR to {customer}?", timeout=30)
    def refund(customer: str, amount: int, approval: Any = None) -> str:
        refunded.append((customer, amount, approval))
        return "done"

    reviewer = decide_when_asked(web, approve=True, fields={"answer-comment": "ok"})
    assert refund("cus_9", 40) == "done"
    reviewer.join(30)
    assert refunded == [("cus_9", 40, {"approved": True, "comment": "ok"})]
    (approval,) = list(grundlag.runs(consumer="approval"))
    assert approval.status == "completed"

    reviewer = decide_when_asked(web, approve=False)
    with pytest.raises(Rejected):
        refund("cus_9", 4000)
    reviewer.join(30)
    assert len(refunded) == 1


def test_timed_out_leaves_it_pending_or_cancels_it(grundlag: Client) -> None:
    with pytest.raises(TimedOut) as timed_out:
        grundlag.request_approval("Anyone there?", timeout=1)
    assert grundlag.get_approval(timed_out.value.id).status == "pending"
    with pytest.raises(TimedOut) as cancelled:
        grundlag.request_approval("Still there?", timeout=1, cancel_on_timeout=True)
    assert grundlag.get_approval(cancelled.value.id).status == "cancelled"


def test_runs_are_started_answered_and_listed(grundlag: Client) -> None:
    run = grundlag.start_run("send_invoice", {"invoice_id": "CL-1", "amount": 5}, wait=20)
    assert run.status == "interrupted" and run.interrupt is not None
    assert run.interrupt.message == "Approve sending the invoice?"
    done = grundlag.resume(run.interrupt.id, {"approved": True}, wait=20)
    assert done.status == "completed" and done.output["invoice_id"] == "CL-1"

    for n in range(3):
        grundlag.start_run("send_invoice", {"invoice_id": f"CL-{n + 2}", "amount": 1})
    listed = list(grundlag.runs(action="send_invoice", limit=2))
    assert len(listed) == 4 and len({each.id for each in listed}) == 4
    assert [grundlag.wait(each.id, timeout=20).status for each in listed[:3]] == ["interrupted"] * 3
    pending = list(grundlag.interrupts(status="pending", limit=2))
    assert len(pending) == 3
    rejected = grundlag.reject(pending[0].id, "wrong amount", wait=20)
    assert rejected.status == "rejected"


class LosingProxy:
    """A TCP proxy to the server that, while ``lose`` is above zero, lets a request through and
    drops its answer: the server has made the change, the client never hears of it."""

    def __init__(self, upstream: int) -> None:
        self.upstream, self.lose = upstream, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(downstream,), daemon=True).start()

    def _serve(self, downstream: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream))
        threading.Thread(target=self._pipe, args=(downstream, upstream, False), daemon=True).start()
        self._pipe(upstream, downstream, True)

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if answers and self.lose > 0:
                    self.lose -= 1
                    break  # the answer is lost on the way
                sink.sendall(chunk)
        except OSError:
            pass
        for each in (source, sink):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
            each.close()

    def close(self) -> None:
        self.listener.close()


def test_a_lost_answer_is_retried_with_its_key_and_changes_nothing_twice(web: Server, site: Site) -> None:
    proxy = LosingProxy(web.port)
    try:
        with Client(f"http://127.0.0.1:{proxy.port}", site.token, timeout=10) as api:
            proxy.lose = 1
            run = api.start_run("send_invoice", {"invoice_id": "LOST-1", "amount": 3}, wait=20)
            assert run.status == "interrupted" and run.interrupt is not None
            proxy.lose = 1
            approval = api.create_approval("Lost answer?", {"n": 1})
            assert approval.status == "pending"
            proxy.lose = 1
            resumed = api.resume(run.interrupt.id, {"approved": True}, wait=20)
            assert resumed.status == "completed"
        with httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {site.token}"}) as plain:
            runs = plain.get("/api/runs", params={"limit": 200}).json()["items"]
        assert [r["action"] for r in runs].count("send_invoice") == 1
        assert [r["action"] for r in runs].count("approval") == 1
        detail = httpx.get(
            f"{web.url}/api/runs/{run.id}", headers={"Authorization": f"Bearer {site.token}"}
        ).json()
        assert [entry["status"] for entry in detail["transcript"]] == ["approved"]
    finally:
        proxy.close()
