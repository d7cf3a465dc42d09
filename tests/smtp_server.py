"""A real SMTP server on 127.0.0.1 for the tests and the benchmark (aiosmtpd): keeps every
message it is sent, parsed, with the time it arrived."""

from __future__ import annotations

import email
import email.policy
import socket
import threading
import time
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[tuple[float, EmailMessage]] = []
        self.lock = threading.Lock()
        mailbox = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
                message = email.message_from_bytes(envelope.content, policy=email.policy.default)
                assert isinstance(message, EmailMessage)
                with mailbox.lock:
                    mailbox.messages.append((time.time(), message))
                return "250 Message accepted for delivery"

        with socket.socket() as probe:  # aiosmtpd checks its own port, so it cannot take port 0
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def to(self, address: str) -> list[EmailMessage]:
        with self.lock:
            return [m for _, m in self.messages if address in str(m["To"])]

    def stop(self) -> None:
        self.controller.stop()


def text_of(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("plain",))
    assert part is not None
    return str(part.get_content())


def html_of(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("html",))
    assert part is not None
    return str(part.get_content())
