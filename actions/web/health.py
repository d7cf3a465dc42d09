"""Production's endpoints: /healthz (the process answers), /readyz (what it needs answers too)
and /metrics (Prometheus, for the bearer of GRUNDLAG_METRICS_TOKEN only)."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from actions.models import Team
from actions.web.middleware import respond

logger = logging.getLogger(__name__)

# Each dependency gets this long to answer before /readyz calls it down.
CHECK_SECONDS = 2.0
# /readyz answers from its last check for this long: probes from every orchestrator (or anyone,
# it is open) cost at most one check per second per process.
READY_FOR_SECONDS = 1.0
_last_check: tuple[float, dict[str, str]] | None = None
_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


def _checking() -> asyncio.Lock:
    """One check at a time per event loop: the probes that arrive meanwhile share its answer."""
    loop = asyncio.get_running_loop()
    if loop not in _locks:
        _locks.clear()  # a loop gone (tests start one per test) takes its lock with it
        _locks[loop] = asyncio.Lock()
    return _locks[loop]


HEALTHZ = "/healthz"


def answering_liveness(app: Any) -> Any:
    """ASGI, outermost (grundlag_site.asgi): ``GET /healthz`` (and HEAD) is answered by the event
    loop that serves every request, before anything else runs: 200 while the process serves.
    Nothing else is asked, so a database outage does not make an orchestrator restart every web
    process; and neither does a flood, which queues the requests that go into Django's threads
    (one per request, each waiting its turn for the interpreter): a liveness probe answered
    there failed at 280 ms under bench/isolation.py's 400 long-polls, and an orchestrator
    that restarts a process because it is busy makes the others busier."""

    async def live(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != HEALTHZ:
            await app(scope, receive, send)
            return
        no_store = (b"cache-control", b"no-store")
        if scope.get("method") not in ("GET", "HEAD"):
            await respond(send, 405, b"", b"text/plain", [no_store, (b"allow", b"GET, HEAD")])
            return
        await respond(send, 200, b"ok\n", b"text/plain", [no_store], head=scope.get("method") == "HEAD")

    return live


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """The same answer where the edge is not in front (WSGI, Django's test client); under ASGI
    answering_liveness answers first."""
    return HttpResponse("ok\n", content_type="text/plain")


def _database() -> None:
    # A query, not a connect: a connection kept open (CONN_MAX_AGE) to a database that went away
    # would pass a connect check.
    Team.objects.exists()


def _broker() -> None:
    if settings.CELERY_BROKER_URL.startswith("memory://"):
        return  # the embedded setup: steps run in this process's threads
    import redis  # noqa: PLC0415 (Redis's client, only where Redis is configured)

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=CHECK_SECONDS)
    try:
        client.ping()
    finally:
        client.close()


async def _channel_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured")
    await layer.group_send("grundlag-readyz", {"type": "readyz"})


async def _check(name: str, probe: Any, *, own_thread: bool = False) -> tuple[str, str]:
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            if inspect.iscoroutinefunction(probe):
                await probe()
            else:
                # The database on the thread of the request's other database work (its
                # connection is closed with the request's); the broker on one of its own.
                await sync_to_async(probe, thread_sensitive=not own_thread)()
    except Exception as exc:
        logger.warning("readyz: %s is not answering: %r", name, exc)
        return name, "unavailable"
    return name, "ok"


async def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: the database, the broker and the channel layer answer. 503 naming what
    does not (the reason goes to the log, not to whoever asks)."""
    global _last_check
    if request.method != "GET":
        return HttpResponse(status=405, headers={"Allow": "GET"})
    async with _checking():
        if _last_check is None or time.monotonic() - _last_check[0] > READY_FOR_SECONDS:
            results = await asyncio.gather(
                _check("database", _database),
                _check("broker", _broker, own_thread=True),
                _check("channel_layer", _channel_layer),
            )
            _last_check = (time.monotonic(), dict(results))
        checks = _last_check[1]
    ready = all(state == "ok" for state in checks.values())
    return JsonResponse({"ready": ready, **checks}, status=200 if ready else 503)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus's text format, for the bearer of GRUNDLAG_METRICS_TOKEN; 404 when no token is
    set (the figures name teams and actions, so they are never public)."""
    token = settings.GRUNDLAG_METRICS_TOKEN
    if not token:
        return HttpResponse(
            "Metrics are off. Set GRUNDLAG_METRICS_TOKEN to serve them to its bearer.\n",
            status=404,
            content_type="text/plain",
        )
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        return HttpResponse(
            "A bearer token is required (Authorization: Bearer <GRUNDLAG_METRICS_TOKEN>).\n",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
