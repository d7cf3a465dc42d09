"""The TypeScript client (clients/typescript, built by `make node`) against `make run`'s server,
with node's own test runner (clients/typescript/test): approvals asked, decided and refused,
waits that time out, retries with the same Idempotency-Key, runs paged, its types checked
against the OpenAPI document, and Standard Webhooks verification."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.integration.processes import Server, Site, decide

pytestmark = pytest.mark.integration

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"


ANSWERS: dict[str, dict[str, str] | None] = {
    # What the reviewer answers, by question (None: rejects it, "not this week").
    "Deploy billing 2.3?": {"answer-window": "tonight"},
    "Deploy billing 2.4?": {"answer-window": "weekend"},
    "Rotate the signing key?": None,
}


def reviewer_at_work(web: Server, token: str, stop: threading.Event) -> threading.Thread:
    """reviewer1 on the dashboard, deciding the questions of ANSWERS as they arrive."""

    def work() -> None:
        decided: set[int] = set()
        with web.client(token) as api:
            while not stop.wait(0.1):
                for it in api.get("/api/interrupts", params={"status": "pending"}).json()["items"]:
                    if it["message"] in ANSWERS and it["id"] not in decided:
                        fields = ANSWERS[it["message"]]
                        decide(web, it["id"], approve=fields is not None, fields=fields)
                        decided.add(it["id"])

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_the_typescript_client_passes_its_tests_against_the_server(site: Site) -> None:
    assert (CLIENT / "dist" / "index.js").exists(), "build it first: make node"
    server = site.serve()
    stop = threading.Event()
    reviewer = reviewer_at_work(server, site.token, stop)
    try:
        result = subprocess.run(
            ["node", "--test", "--test-reporter=spec", "test/"],
            cwd=CLIENT,
            env={**os.environ, "GRUNDLAG_URL": server.url, "GRUNDLAG_TOKEN": site.token},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stop.set()
        reviewer.join(30)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "ℹ fail 0" in result.stdout and "ℹ pass 10" in result.stdout, result.stdout[-3000:]
