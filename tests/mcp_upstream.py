"""An upstream MCP server for the gateway's tests, built with the official ``mcp`` SDK
(MCPServer, Streamable HTTP on 127.0.0.1): a payments service's tools. It records every call it
gets (tool, arguments, the Authorization header, the receipt in ``_meta`` and whether it
verifies with grundlag_client.receipts against the site's keys) to a JSON-lines file, the way a
real tool would keep its own log.

    python -m tests.mcp_upstream --port 8765 --log calls.jsonl [--site http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from grundlag_client.receipts import InvalidReceipt, fetch_jwks, verify_receipt

RECEIPT_META = "io.grundlag/receipt"
SECRET = "upstream-secret"


def build(log: Path, site: str = "", audience: str = "") -> MCPServer:
    server = MCPServer("payments")
    lock = threading.Lock()
    seen: set[str] = set()

    def record(ctx: Context, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        request = ctx.request_context.request
        meta = dict(ctx.request_context.meta or {})
        receipt = meta.get(RECEIPT_META)
        entry: dict[str, Any] = {
            "tool": tool,
            "arguments": arguments,
            "authorization": request.headers.get("authorization") if request is not None else None,
            "receipt": receipt,
        }
        if isinstance(receipt, str) and site:
            try:
                said = verify_receipt(
                    receipt,
                    fetch_jwks(site),
                    arguments,
                    audience=audience,
                    action=f"payments/{tool}",
                    seen=seen,
                )
                entry["receipt_verified"], entry["approved_by"] = True, said.approved_by
            except InvalidReceipt as exc:
                entry["receipt_verified"], entry["receipt_error"] = False, str(exc)
            except Exception as exc:  # noqa: BLE001 - a check that could not be made: for the test to say
                entry["receipt_verified"], entry["receipt_error"] = False, repr(exc)
        with lock, log.open("a") as out:
            out.write(json.dumps(entry) + "\n")
        return entry

    @server.tool()
    def refund(order_id: str, amount: float, ctx: Context) -> dict[str, Any]:
        """Refund an order (money leaves the company)."""
        record(ctx, "refund", {"order_id": order_id, "amount": amount})
        return {"refunded": order_id, "amount": amount}

    @server.tool()
    def lookup_order(order_id: str, ctx: Context) -> dict[str, Any]:
        """Read an order."""
        record(ctx, "lookup_order", {"order_id": order_id})
        return {"order_id": order_id, "status": "shipped"}

    @server.tool()
    async def reload_catalogue(ctx: Context) -> str:
        """Reload the catalogue: the server's tools may change, and it says so."""
        record(ctx, "reload_catalogue", {})
        # On this request's stream (a stateless server has no other to send it on).
        await ctx.session.send_notification(
            types.ToolListChangedNotification(), related_request_id=ctx.request_id
        )
        return "reloaded"

    return server


def app(log: Path, site: str = "", audience: str = "") -> Any:
    """The server's ASGI app at /mcp, refusing a request without the upstream's own token."""
    inner = build(log, site, audience).streamable_http_app(
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {SECRET}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no"})
                return
        await inner(scope, receive, send)

    return guarded


def calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


class Upstream:
    """The server in a thread of this process (uvicorn), for tests that need no other process."""

    def __init__(self, port: int, log: Path, site: str = "") -> None:
        self.log = log
        config = uvicorn.Config(
            app(log, site), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}/mcp"

    def __enter__(self) -> Upstream:
        self.thread.start()
        while not self.server.started:
            threading.Event().wait(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def calls(self) -> list[dict[str, Any]]:
        return calls(self.log)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--site", default="")
    options = parser.parse_args()
    # Its own URL, as the team registers it: the receipts it accepts are those made for it.
    audience = f"http://127.0.0.1:{options.port}/mcp"
    uvicorn.run(
        app(options.log, options.site, audience), host="127.0.0.1", port=options.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
