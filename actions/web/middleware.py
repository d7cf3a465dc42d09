from __future__ import annotations

import hashlib
import io
import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import axes.middleware
from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core.checks import Error
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.module_loading import import_string

from actions import engine
from actions.live.waiting import Places
from actions.models import ApiToken, IdempotencyKey

logger = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware:
    """Turn a lost database connection into a clear 503 instead of a 500 page.

    Every state change is one transaction, so a failure leaves nothing half-written: saying
    "nothing was changed" is true. The page is plain HTML: rendering the site's templates
    would need the database (the session, the user)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("database unavailable during %s %s: %s", request.method, request.path, exception)
        if request.headers.get("HX-Request"):
            return HttpResponse(engine.DATABASE_UNAVAILABLE, status=503, content_type="text/plain")
        body = f"<!doctype html><title>Unavailable</title><h1>503</h1><p>{engine.DATABASE_UNAVAILABLE}</p>"
        return HttpResponse(body, status=503)


def too_large(length: int | None, limit: int) -> str:
    """What a client whose body is over the limit is told (``length``: as declared, if it was)."""
    if length is None:
        return f"the request body is over the limit of {limit} bytes"
    return f"the request body is {length} bytes; the limit is {limit} bytes"


class RequestSizeLimitMiddleware:
    """Refuse a request body over the limit with 413 naming the limit, by its Content-Length.
    (Without this, Django answers a plain 400 page when the view reads the body.) Under daphne
    BodyLimit has refused it before Django read it; this is for WSGI and Django's test client."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit:
            detail = too_large(length, limit)
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": detail}, status=413)
            return HttpResponse(detail, status=413, content_type="text/plain")
        return self.get_response(request)


class BodyLimit:
    """ASGI, in front of the whole HTTP app (grundlag_site.asgi): a request body over
    DATA_UPLOAD_MAX_MEMORY_SIZE is answered 413 and never handed on. Django's ASGI handler reads
    a body whole (to a spooled file) before any middleware of its own runs, and a body without
    a Content-Length (chunked) would then be read whole into memory by ``request.body``: the cap
    must come before it. A Content-Length over the cap is refused without reading anything; a
    body without one is read up to one byte past the cap, and refused there. The error is the
    API's (``{"detail": ...}``) under /api/ and /mcp/, plain text elsewhere.

    Daphne itself (Twisted) takes in a whole body, to a temporary file and then into the app's
    queue, before it calls the app: ``cap_daphne_bodies`` stops it at the door."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if scope["type"] != "http" or limit is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                length = -1  # the server's to refuse; nothing to count here
            if length > limit:
                await self.refuse(scope, send, too_large(length, limit))
                return
            if length >= 0:
                # The server hands on no more than it declares.
                await self.app(scope, receive, send)
                return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await self.refuse(scope, send, too_large(None, limit))
                return
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": bytes(body), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    @staticmethod
    async def refuse(scope: dict[str, Any], send: Any, detail: str) -> None:
        path = str(scope.get("path", ""))
        if path.startswith(("/api/", "/mcp")):
            body, content_type = json.dumps({"detail": detail}).encode(), b"application/json"
        else:
            body, content_type = detail.encode(), b"text/plain; charset=utf-8"
        await respond(send, 413, body, content_type)


class TokenConcurrency:
    """ASGI, in front of the whole HTTP app (grundlag_site.asgi): at most
    GRUNDLAG_MAX_REQUESTS_PER_TOKEN requests of one bearer token under way at once in this
    process, on /api/ and /mcp/; past it, 429 with ``Retry-After: 1`` at once, before Django
    runs anything. Django runs each request's synchronous code in a thread of its own, and
    those threads take turns at the interpreter: without this, 400 requests sent at once by
    one token hold up every other team's requests for seconds, though the rate limit lets them
    through (it counts, it does not pace).
    Counted by the token as sent (its hash), so nothing is read from the database to count; a
    made-up token counts as one more token, and fails its check as before."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.under_way = Places()  # by the token's hash

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        most = settings.GRUNDLAG_MAX_REQUESTS_PER_TOKEN
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not most or not path.startswith(("/api/", "/mcp")):
            await self.app(scope, receive, send)
            return
        scheme, _, sent = dict(scope.get("headers") or []).get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer" or not sent.strip():
            await self.app(scope, receive, send)
            return
        key = hashlib.sha256(sent.strip()).digest()  # as the token's check reads it
        with self.under_way.take(key, most) as place:
            if place:

                async def answering(message: dict[str, Any]) -> None:
                    await send(message)
                    # Answered: under way no longer, for the client, which may send the next at
                    # once; what the app does after (closing, its connection given back) is not
                    # counted against it.
                    if message["type"] == "http.response.body" and not message.get("more_body"):
                        place.give_back()

                await self.app(scope, receive, answering)
                return
        body = json.dumps(
            {"detail": f"this token has {most} requests under way already; retry when one has ended"}
        ).encode()
        await respond(send, 429, body, b"application/json", [(b"retry-after", b"1")])


class RequestThreads:
    """Each request's synchronous part (Django's middleware and views, the engine) runs on a
    thread of its own, as Django's ASGI handler arranges (ThreadSensitiveContext); the handler
    makes that thread for the request, and another to join it after: 0.35 to 0.9 ms of the
    process's CPU a request (bench/RESULTS.md). Here a request takes an idle one of the threads
    earlier requests used instead, as a WSGI server's pool would, and gives it back when it is
    answered. A request that failed or was cancelled (the client went away) gives none back:
    its work may still be running there, or have left state that nothing cleaned up; that
    thread ends when its work does. At most ``keep`` idle threads are kept."""

    def __init__(self, app: Any, keep: int = 32) -> None:
        self.app = app
        self.keep = keep
        self.idle: list[_RequestThread] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Taken and given back on the event loop's thread only: no lock.
        thread = self.idle.pop() if self.idle else _RequestThread()
        ended = False
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.app(scope, receive, send)
            ended = True
        finally:
            # A request cancelled or failed may have left its work in the thread's state (a
            # connection Django's request_finished never closed): that thread is not kept.
            if not ended or thread.busy or len(self.idle) >= self.keep:
                thread.shutdown(wait=False)
            else:
                self.idle.append(thread)


class _RequestThread(ThreadPoolExecutor):
    """One thread, which says whether it has work under way."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="grundlag-request")
        self._under_way = 0
        self._count = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._under_way > 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        with self._count:
            self._under_way += 1
        try:
            future = super().submit(self._run, fn, *args, **kwargs)
        except BaseException:
            self._ended()
            raise
        future.add_done_callback(self._cancelled)
        return future

    def _cancelled(self, future: Future[Any]) -> None:
        if future.cancelled():  # before it ran: _run never counts it off
            self._ended()

    def _run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            self._ended()  # before the future is done: the request sees it idle once answered

    def _ended(self) -> None:
        with self._count:
            self._under_way -= 1


async def respond(
    send: Any,
    status: int,
    body: bytes,
    content_type: bytes,
    headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    head: bool = False,
) -> None:
    """Answer an ASGI HTTP request at once, from in front of the app (``head``: the headers of
    ``body``, its length included, without it)."""
    start = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": b"" if head else body})


def _replay(messages: list[dict[str, Any]], receive: Any) -> Any:
    """A ``receive`` that gives ``messages`` first, then what ``receive`` gives (a disconnect)."""
    pending = list(messages)

    async def replayed() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        return dict(await receive())

    return replayed


class ApiJsonErrorsMiddleware:
    """Every error under /api/ is JSON with a "detail", whoever produced it: ninja's own 405,
    Django's 404 for an unknown path, a CSRF or size refusal."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            request.path.startswith("/api/")
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            detail = response.content.decode(errors="replace").strip() if len(response.content) < 200 else ""
            json_response = JsonResponse(
                {"detail": detail or response.reason_phrase}, status=response.status_code
            )
            for header in ("Allow", "WWW-Authenticate"):
                if header in response:
                    json_response[header] = response[header]
            return json_response
        return response


class IdempotencyMiddleware:
    """``Idempotency-Key`` on the API's POSTs, with Stripe's semantics: a retry with the same key
    and the same request gets the first answer again (``Idempotent-Replayed: true``), not a
    second run or decision; with another request (method, path or body), 422. A key is kept
    with the change its request made, in the same transaction (actions.engine.idempotency),
    for 24 hours per token; a request that changed nothing keeps none, and runs again."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        key = request.headers.get("Idempotency-Key")
        if key is None or request.method != "POST" or not request.path.startswith("/api/"):
            return self.get_response(request)
        if not (0 < len(key) <= MAX_IDEMPOTENCY_KEY and key.isascii() and key.isprintable()):
            return JsonResponse(
                {"detail": f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"},
                status=400,
            )
        token = engine.authenticate(ApiToken.key_in(request.headers.get("Authorization", "")))
        if token is None:
            return self.get_response(request)  # refused by the API's own authentication
        digest = engine.idempotency.request_hash(request.method, request.get_full_path(), request.body)

        def first_use() -> IdempotencyKey | None:
            return IdempotencyKey.objects.filter(token=token, key=key).first()

        if (first := first_use()) is not None:
            return replayed(first, digest)
        with engine.idempotency.requested(engine.idempotency.Claim(token.pk, key, digest)) as claim:
            response = self.get_response(request)
        if claim.row_id is None:
            # Refused, perhaps because a request with the same key made the change meanwhile (a
            # decision retried while the first was being made: "already decided"): its answer, or
            # that it is being answered, is this one's too.
            if response.status_code >= 400 and (first := first_use()) is not None:
                return replayed(first, digest)
            return response
        if response.status_code < 500 and not response.streaming:
            try:
                engine.idempotency.answered(
                    claim, response.status_code, response.content, response.get("Content-Type", "")
                )
            except Exception:
                # The change is made and answered; a retry is told it was made (not made again).
                logger.exception("could not keep the answer to Idempotency-Key %r", key)
        return response


MAX_IDEMPOTENCY_KEY = 255


def replayed(first: Any, digest: str) -> HttpResponse:
    """The answer to a retry of the request that first used the key (an IdempotencyKey)."""
    if first.request_hash != digest:
        return JsonResponse(
            {
                "detail": "This Idempotency-Key was used with another request (method, path or body)."
                " A new request needs a new key."
            },
            status=422,
        )
    if first.status_code is not None:
        response = HttpResponse(
            bytes(first.response), status=first.status_code, content_type=first.content_type
        )
        response["Idempotent-Replayed"] = "true"
        return response
    # A request may be held by its wait, or, with inline steps, by the step it runs.
    longest = settings.GRUNDLAG_MAX_WAIT_SECONDS + (
        settings.GRUNDLAG_MAX_STEP_SECONDS if settings.GRUNDLAG_INLINE_STEPS else 0
    )
    in_flight = timedelta(seconds=longest + IN_FLIGHT_MARGIN_SECONDS)
    if first.created_at > timezone.now() - in_flight:
        response = JsonResponse({"detail": engine.idempotency.IN_USE}, status=409)
        response["Retry-After"] = "1"
        return response
    # Its change was made, and its answer lost with the process that was giving it.
    run = f" (run {first.run_id}: GET /api/runs/{first.run_id})" if first.run_id else ""
    return JsonResponse(
        {
            "detail": "The request with this Idempotency-Key made its change, but was never answered"
            f" (its server stopped){run}. It is not made again.",
            "run_id": first.run_id,
        },
        status=409,
    )


# How long past the longest wait a request's answer may take before it is presumed lost.
IN_FLIGHT_MARGIN_SECONDS = 60


class AxesMiddleware(axes.middleware.AxesMiddleware):  # type: ignore[misc]  # axes is untyped here
    """django-axes' middleware, run in the request's thread like the others. Axes' own can run
    in the event loop; last in the stack, it made the site's middleware switch to the loop for
    it, and CSPMiddleware (before it) with it, crossing between the loop and the request's
    thread four times more per request, each crossing waiting its turn for the interpreter
    on a busy server. Now the stack runs in one thread, and only the view's own work crosses."""

    async_capable = False


def axes_middleware_last(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """A system check in place of Axes' own (axes.W002, which looks for its middleware by name
    and so would not see this subclass): the last middleware must be Axes', or one made of it,
    or locked-out logins would not be answered as such."""
    last = settings.MIDDLEWARE[-1] if settings.MIDDLEWARE else ""
    try:
        ok = issubclass(import_string(last), axes.middleware.AxesMiddleware)
    except ImportError:
        ok = False
    if ok:
        return []
    return [
        Error(
            f"The last of settings.MIDDLEWARE is {last!r}, not Axes' middleware",
            hint="End MIDDLEWARE with actions.web.middleware.AxesMiddleware (django-axes' lock-out).",
            id="grundlag.E001",
        )
    ]


def cap_daphne_bodies(limit: int) -> None:
    """Make daphne refuse a request body over ``limit`` bytes as it arrives, before it keeps any
    of it: a Content-Length over it as soon as the headers are in, a body without one (chunked)
    at the first byte past it. The answer is a 413 with the API's error body, and the
    connection is closed (the rest of the body is never read). Daphne has no setting for this;
    its request class (Twisted's ``Request``) is told here, once, when the ASGI app is built."""
    try:
        from daphne.http_protocol import WebRequest  # noqa: PLC0415 (daphne's, only under daphne)
    except ImportError:  # served by another ASGI server: BodyLimit still holds
        return
    if getattr(WebRequest, "grundlag_limit", None) is not None:
        WebRequest.grundlag_limit = limit
        return
    took_length, took_chunk, took_process = (
        WebRequest.gotLength,
        WebRequest.handleContentChunk,
        WebRequest.process,
    )

    def refuse(request: Any, message: str) -> None:
        request.grundlag_refused = True
        body = json.dumps({"detail": message}).encode()
        transport = request.channel.transport
        transport.write(
            b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        transport.loseConnection()

    def gotLength(self: Any, length: int | None) -> None:  # noqa: N802 - Twisted's name
        self.grundlag_received = 0
        self.grundlag_refused = False
        if length is not None and length > WebRequest.grundlag_limit:
            self.content = io.BytesIO()  # nothing of it is kept
            self.requestHeaders.removeHeader(b"expect")  # no "100 Continue" after the 413
            refuse(self, too_large(length, WebRequest.grundlag_limit))
            return
        took_length(self, length)

    def handleContentChunk(self: Any, data: bytes) -> None:  # noqa: N802 - Twisted's name
        if getattr(self, "grundlag_refused", False):
            return
        self.grundlag_received = getattr(self, "grundlag_received", 0) + len(data)
        if self.grundlag_received > WebRequest.grundlag_limit:
            refuse(self, too_large(None, WebRequest.grundlag_limit))
            return
        took_chunk(self, data)

    def process(self: Any) -> None:
        if not getattr(self, "grundlag_refused", False):  # a refused body reaches no app
            took_process(self)

    WebRequest.grundlag_limit = limit
    WebRequest.process = process
    WebRequest.gotLength = gotLength
    WebRequest.handleContentChunk = handleContentChunk
