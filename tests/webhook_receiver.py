"""A webhook endpoint on 127.0.0.1 for the tests: records each request, and verifies them with
the `standardwebhooks` package, as a calling application would."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook as Verifier


class Receiver:
    """A webhook endpoint: records each request, answers the next of ``codes`` (then 200)."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.codes: list[int] = []
        # Seconds to hold the next requests before answering (a slow endpoint).
        self.delays: list[float] = []
        # What to do while the next requests are held, before answering (each once).
        self.during: list[Callable[[], None]] = []
        self.arrived = threading.Event()
        self.times: list[float] = []  # when each request arrived (epoch seconds)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                receiver.times.append(time.time())
                receiver.arrived.set()
                if receiver.delays:
                    time.sleep(receiver.delays.pop(0))
                if receiver.during:
                    receiver.during.pop(0)()
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def verified(self, secret: str) -> list[dict[str, Any]]:
        """Every body received, each verified with the secret (raises on a bad signature)."""
        verifier = Verifier(secret)
        return [verifier.verify(body, headers) for headers, body in self.received]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
