"""The MCP endpoint over ASGI: Streamable HTTP at /mcp/, the token, its rate and its waits
checked before the JSON-RPC is read."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
from typing import Any
from urllib.parse import urlparse

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from actions import engine
from actions.live import waiting
from actions.mcp.results import caller_token, off_the_loop
from actions.mcp.server import build_server
from actions.models import ApiToken, Scope

logger = logging.getLogger(__name__)

# ASGI


async def _respond(send: Any, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def origin_allowed(origin: bytes) -> bool:
    """Whether a page of this origin (an ``Origin`` header) may call: one of
    GRUNDLAG_ALLOWED_ORIGINS, matched by channels' OriginValidator as the websocket's are."""
    try:
        parsed = urlparse(origin.decode("latin-1"))
        return bool(OriginValidator(None, settings.GRUNDLAG_ALLOWED_ORIGINS).validate_origin(parsed))
    except ValueError:  # not a URL, or a port that is not a number
        return False


def _retry_after(token: ApiToken) -> int | None:
    """None while the token is within its rate of requests (the API's, GRUNDLAG_API_RATE: one
    budget for /api/ and /mcp/); else the seconds before it may ask again (Retry-After)."""
    request = HttpRequest()
    request.auth = token  # type: ignore[attr-defined]  # where ninja's authentication puts it
    return waiting.TokenRateThrottle().retry_after(request)


class Endpoint:
    """The ASGI app at /mcp/: the site's allowed hosts and origins, the API's bearer token, then
    the SDK's Streamable HTTP transport (stateless). An ``Origin`` header says a browser sent
    the request: from a page not allowed, it is refused (403) before anything else, as the
    transport's spec asks against DNS rebinding; MCP clients that are programs send none.
    Daphne sends no lifespan events: the SDK's session manager is started by the first
    request, in a task of its own that lives with the process."""

    def __init__(self, server: Server[Any]) -> None:
        self.server = server
        self._manager: StreamableHTTPSessionManager | None = None
        self._starting: asyncio.Lock | None = None
        self._runner: asyncio.Task[None] | None = None

    async def manager(self) -> StreamableHTTPSessionManager:
        if self._manager is not None:
            return self._manager
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._manager is None:
                manager = StreamableHTTPSessionManager(
                    app=self.server,
                    stateless=True,
                    json_response=False,
                    # The site's one cap (BodyLimit refuses a bigger body before this sees it),
                    # not the SDK's own 4 MiB.
                    max_request_body_size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
                )
                ready = asyncio.Event()

                async def run() -> None:
                    async with manager.run():
                        ready.set()
                        await asyncio.Event().wait()  # as long as the process

                # A context of its own: not the first request's.
                self._runner = asyncio.get_running_loop().create_task(run(), context=contextvars.Context())
                waiter = asyncio.ensure_future(ready.wait())
                await asyncio.wait({self._runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if not ready.is_set():
                    waiter.cancel()
                    self._runner.result()  # why it did not start
                self._manager = manager
        return self._manager

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        host, _ = split_domain_port(headers.get(b"host", b"").decode("latin-1"))
        if not validate_host(host, settings.ALLOWED_HOSTS):
            await _respond(send, 400, {"error": "bad_request", "error_description": "Host not allowed"}, [])
            return
        origin = headers.get(b"origin")
        if origin is not None and not origin_allowed(origin):
            await _respond(send, 403, {"error": "forbidden", "error_description": "Origin not allowed"}, [])
            return
        token = await off_the_loop(engine.authenticate)(
            ApiToken.key_in(headers.get(b"authorization", b"").decode("latin-1"))
        )
        if token is None:
            body = {"error": "invalid_token", "error_description": "An API token is required (Bearer)"}
            await _respond(send, 401, body, [(b"www-authenticate", b'Bearer error="invalid_token"')])
            return
        if not token.allows([Scope.MCP]):
            # RFC 6750's answer to a token in force without the scope asked for.
            body = {
                "error": "insufficient_scope",
                "error_description": "This token needs the scope mcp to call the team's tools",
            }
            challenge = b'Bearer error="insufficient_scope", scope="mcp"'
            await _respond(send, 403, body, [(b"www-authenticate", challenge)])
            return
        upstream = None
        if (name := scope.get("grundlag.upstream_name")) is not None:
            upstream = await off_the_loop(engine.gateway.for_token)(token, name)
            if upstream is None:  # no such upstream, or another team's: the same answer
                body = {
                    "error": "not_found",
                    "error_description": f"This team has no MCP upstream named {name}",
                }
                await _respond(send, 404, body, [])
                return
        if scope["method"] == "GET":
            # Stateless: there is no stream for the server's own messages to offer.
            await _respond(send, 405, {"error": "method_not_allowed"}, [(b"allow", b"POST")])
            return
        if (retry_after := await sync_to_async(_retry_after, thread_sensitive=False)(token)) is not None:
            body = {"error": "rate_limited", "error_description": "Too many requests for this token"}
            await _respond(send, 429, body, [(b"retry-after", str(retry_after).encode())])
            return
        manager = await self.manager()
        reset = caller_token.set(token)
        try:
            # As Django does for each request: the request's database work in a thread of its
            # own, not queued behind every other MCP call and websocket of the process.
            async with ThreadSensitiveContext():
                await manager.handle_request(
                    {**scope, "grundlag.token": token, "grundlag.upstream": upstream}, receive, send
                )
        finally:
            caller_token.reset(reset)


endpoint = Endpoint(build_server())


_GATEWAY = re.compile(r"^/mcp/gateway/([a-z0-9-]{1,50})/?$")


def mount(app: Any, path: str = "/mcp") -> Any:
    """``app`` with /mcp and /mcp/ answered by the MCP endpoint, and /mcp/gateway/<name>/ by the
    gateway to the team's upstream of that name (none redirects: an MCP client follows no
    redirect of a POST)."""

    async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == path:
            await endpoint(scope, receive, send)
        elif scope["type"] == "http" and (match := _GATEWAY.match(scope["path"])):
            await endpoint({**scope, "grundlag.upstream_name": match.group(1)}, receive, send)
        else:
            await app(scope, receive, send)

    return route
