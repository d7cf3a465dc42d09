"""Daphne refuses a body over the cap as it arrives (issue 35): a 300 MB Content-Length is
answered 413 as soon as its headers are in, with nothing of the body sent, and a chunked body at
the first byte past the cap; the server keeps none of it, and goes on serving."""

from __future__ import annotations

import json
import socket

import pytest

from tests.integration.processes import Site

pytestmark = pytest.mark.integration

LIMIT = 256 * 1024 + 64 * 1024  # DATA_UPLOAD_MAX_MEMORY_SIZE by default


def exchange(port: int, head: bytes, chunks: list[bytes]) -> tuple[bytes, int]:
    """Send ``head`` then ``chunks`` (stopping when the server closes), and read its answer;
    the answer and how many bytes of the chunks were sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head)
        sent = 0
        try:
            for chunk in chunks:
                conn.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while part := conn.recv(65536):
                answer += part
        except (ConnectionResetError, TimeoutError):
            pass
    return answer, sent


def rss(pid: int) -> int:
    """The process's resident memory, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def body_of(answer: bytes) -> dict[str, str]:
    return dict(json.loads(answer.split(b"\r\n\r\n", 1)[1]))


def test_daphne_refuses_a_declared_300_mb_body_at_once_and_a_chunked_one_past_the_cap(site: Site) -> None:
    server = site.serve()
    auth = f"Authorization: Bearer {site.token}\r\n".encode()
    before = rss(server.proc.pid)
    head = (
        b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + auth
        + b"Content-Length: 300000000\r\n\r\n"
    )
    answer, _ = exchange(server.port, head, [])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert body_of(answer) == {"detail": f"the request body is 300000000 bytes; the limit is {LIMIT} bytes"}

    head = (
        b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + auth
        + b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024)
    answer, sent = exchange(server.port, head, [chunk] * 4000)  # 256 MB, were it all read
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert body_of(answer) == {"detail": f"the request body is over the limit of {LIMIT} bytes"}
    assert sent < 64 * 1024 * 4000  # the connection was closed, not read to the end
    grown = rss(server.proc.pid) - before
    assert grown < 64 * 1024 * 1024, f"the server grew by {grown} bytes"
    with server.client(site.token) as api:  # and goes on serving
        small = api.post(
            "/api/runs", json={"action": "send_invoice", "input": {"invoice_id": "I", "amount": 1}}
        )
        assert small.status_code in (200, 202), small.text
