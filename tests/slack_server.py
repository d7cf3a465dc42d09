"""A local stand-in for Slack on 127.0.0.1, for the tests: its Web API (the methods the app
calls, as slack-sdk's WebClient sends them: form-encoded or JSON, the bot token as a bearer),
recording every call; and the other direction, interactions signed with the app's signing
secret exactly as Slack signs them (v0, HMAC-SHA256 of ``v0:timestamp:body``)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode

TOKEN = "xoxb-test-token"
SIGNING_SECRET = "slack-signing-secret-for-tests"


class SlackServer:
    """Slack's Web API: records calls as (method, params); users are Slack user objects."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.times: list[float] = []  # when each call arrived (epoch seconds)
        self.users: dict[str, dict[str, Any]] = {}
        self.failures: list[str] = []  # the next calls answer {"ok": false, "error": ...}
        self._ts = itertools.count(1)
        self.lock = threading.Lock()
        slack = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
                if "json" in (self.headers.get("content-type") or ""):
                    params = json.loads(body or "{}")
                else:
                    params = dict(parse_qsl(body))
                for key in ("blocks", "view"):
                    if isinstance(params.get(key), str):
                        params[key] = json.loads(params[key])
                method = self.path.rsplit("/", 1)[-1]
                answer = slack.answer(method, params, self.headers.get("authorization", ""))
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def add_user(self, user_id: str, email: str, *, confirmed: bool = True, team: str = "T0TEST") -> None:
        self.users[user_id] = {
            "id": user_id,
            "team_id": team,
            "name": email.split("@")[0],
            "is_email_confirmed": confirmed,
            "profile": {"email": email},
        }

    def answer(self, method: str, params: dict[str, Any], authorization: str) -> dict[str, Any]:
        with self.lock:
            self.calls.append((method, params))
            self.times.append(time.time())
            if authorization != f"Bearer {TOKEN}":
                return {"ok": False, "error": "invalid_auth"}
            if self.failures:
                return {"ok": False, "error": self.failures.pop(0)}
            ts = f"{1700000000 + next(self._ts)}.000100"
        channel = str(params.get("channel", ""))
        if method == "chat.postMessage":
            # A message to a user id goes to the direct conversation with them.
            opened = "D" + channel[1:] if channel.startswith("U") else channel
            return {
                "ok": True,
                "channel": opened,
                "ts": params.get("thread_ts") and ts or ts,
                "message": params,
            }
        if method in ("chat.update", "chat.postEphemeral"):
            return {"ok": True, "channel": channel, "ts": params.get("ts", ts), "message_ts": ts}
        if method == "auth.test":
            return {"ok": True, "team_id": "T0TEST", "user_id": "UBOT", "bot_id": "BBOT"}
        if method == "views.open":
            return {"ok": True, "view": {"id": "V1", **params.get("view", {})}}
        if method == "users.info":
            user = self.users.get(str(params.get("user")))
            return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}
        if method == "users.lookupByEmail":
            found = [u for u in self.users.values() if u["profile"]["email"] == params.get("email")]
            return {"ok": True, "user": found[0]} if found else {"ok": False, "error": "users_not_found"}
        return {"ok": False, "error": "unknown_method"}

    def called(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [params for name, params in self.calls if name == method]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed(
    payload: dict[str, Any], *, secret: str = SIGNING_SECRET, at: float | None = None
) -> tuple[bytes, dict[str, str]]:
    """An interaction as Slack posts it: the form body and its signature headers."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()
    return body, {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": f"v0={digest}"}


def button(
    action_id: str, interrupt_id: int, user_id: str, channel: str = "C0FINANCE", team: str = "T0TEST"
) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "team": {"id": team},
        "user": {"id": user_id, "team_id": team},
        "channel": {"id": channel},
        "trigger_id": "trigger-1",
        "actions": [{"action_id": action_id, "value": str(interrupt_id), "type": "button"}],
    }


def submission(view: dict[str, Any], values: dict[str, Any], user_id: str) -> dict[str, Any]:
    """The modal ``view`` (as the app opened it) submitted with ``values``: block id -> value
    (a string, or True / False for a checkbox ticked or not). What ``values`` leaves out is
    submitted as Slack does, as the view filled it in (its initial options and values)."""
    state: dict[str, Any] = {}
    for block in view.get("blocks", []):
        element = block.get("element") or {}
        if block.get("type") != "input":
            continue
        if element.get("type") == "checkboxes":
            state[block["block_id"]] = {
                "value": {"type": "checkboxes", "selected_options": element.get("initial_options", [])}
            }
        elif element.get("type") == "static_select" and "initial_option" in element:
            state[block["block_id"]] = {
                "value": {"type": "static_select", "selected_option": element["initial_option"]}
            }
        elif "initial_value" in element:
            state[block["block_id"]] = {
                "value": {"type": "plain_text_input", "value": element["initial_value"]}
            }
    for block_id, value in values.items():
        if value is True or value is False:
            ticked = [{"value": "on"}] if value else []
            state[block_id] = {"value": {"type": "checkboxes", "selected_options": ticked}}
        else:
            state[block_id] = {"value": {"type": "plain_text_input", "value": value}}
    return {
        "type": "view_submission",
        "team": {"id": "T0TEST"},
        "user": {"id": user_id, "team_id": "T0TEST"},
        "view": {**view, "state": {"values": state}},
    }
