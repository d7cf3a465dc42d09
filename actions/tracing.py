"""Traces (OpenTelemetry), off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.

``setup()`` (the app's ``ready()``, in every process: the server, its notifier, Celery's
workers, the management commands) installs the SDK with an OTLP/HTTP exporter and the official
instrumentations of Django (each request), Celery (each task, its context carried in the
message), psycopg (each PostgreSQL statement) and httpx (each webhook delivery). The exporter
reads the standard ``OTEL_*`` variables (endpoint, headers, service name, sampler).

One approval is one trace, however long a person takes: the pause keeps its span's context on
the interrupt (``traceparent``, W3C Trace Context), and the notifications of the interrupt and
its decision continue that trace, in whichever process they are sent or made; the decision's
request is linked to it. The engine's spans (the pause, the decision) carry the interrupt, its
action, team, decider, the way it was decided and how long it waited for a person, under the
OpenTelemetry GenAI conventions' names where they have one (``gen_ai.tool.*``).

Nothing here imports the project: any layer may use ``span``, ``context_of``, ``carry`` and
``detached``. With traces off (no endpoint: the SDK is never loaded) ``span`` is a shared no-op
context manager, and the attributes given as a function are never made.

A client's ``traceparent`` header is not taken: a request starts a trace of its own (see
``NotFromHttpClients``). The mail links' tokens and webhooks' URLs never leave in a span.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any, TypeVar

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator, default_getter, default_setter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

tracer = trace.get_tracer("grundlag")
_propagator = TraceContextTextMapPropagator()
_on = False

T = TypeVar("T")


def enabled() -> bool:
    """Whether this process exports traces (``setup()`` found an endpoint)."""
    return _on


def setup(service_name: str = "grundlag") -> bool:
    """Install the SDK, the exporter and the instrumentations, once per process, when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or its traces-only form) is set; whether it did."""
    global _on
    if _on or not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return _on
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":  # the standard switch
        return False
    # Imported here: a process without an endpoint never loads the SDK or the instrumentations.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.instrumentation.asgi import asgi_getter  # noqa: PLC0415
    from opentelemetry.instrumentation.celery import CeleryInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.django import DjangoInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.wsgi import wsgi_getter  # noqa: PLC0415
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    # Which process made a span: an approval's trace crosses the server, its notifier and
    # Celery's workers.
    resource = Resource.create(
        {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", service_name), "process.pid": os.getpid()}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    propagate.set_global_textmap(
        NotFromHttpClients(TraceContextTextMapPropagator(), (asgi_getter, wsgi_getter))
    )
    DjangoInstrumentor().instrument(request_hook=redact_request)
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    PsycopgInstrumentor().instrument(enable_commenter=False)
    HTTPXClientInstrumentor().instrument(request_hook=redact_call)
    _on = True
    return True


class NotFromHttpClients(TextMapPropagator):
    """W3C Trace Context, carried in Celery's messages and on outgoing calls, but not taken from
    the HTTP requests the site serves: a client does not choose an approval's trace (its id, or
    whether it is sampled, which would also decide for the decision and the notifications that
    continue it). A request's span starts a trace of its own."""

    def __init__(self, inner: TextMapPropagator, ignored: tuple[Any, ...]) -> None:
        self._inner, self._ignored = inner, ignored

    def extract(
        self, carrier: Any, context: context.Context | None = None, getter: Any = default_getter
    ) -> context.Context:
        if any(getter is each for each in self._ignored):
            return context if context is not None else Context()
        return self._inner.extract(carrier, context, getter)

    def inject(
        self, carrier: Any, context: context.Context | None = None, setter: Any = default_setter
    ) -> None:
        self._inner.inject(carrier, context, setter)

    @property
    def fields(self) -> set[str]:
        return self._inner.fields


def flush() -> None:
    """Export the spans still buffered (a process about to leave without running its exit
    handlers, where the SDK's own flush lives)."""
    if _on:
        provider = trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            force_flush(timeout_millis=2000)  # a collector that is down does not hold the exit


def redact_request(span: Span, request: Any) -> None:
    """A mail's decision link (/d/<token>/) decides with its token: the token never leaves in a
    span (the request's target, URL and path)."""
    path = getattr(request, "path", "")
    if not path.startswith("/d/") or not hasattr(span, "attributes"):
        return
    token = path.removeprefix("/d/").split("/")[0]
    if not token:
        return
    for key, value in dict(span.attributes or {}).items():
        if isinstance(value, str) and token in value:
            span.set_attribute(key, value.replace(token, "{token}"))


def redact_call(span: Span, request: Any) -> None:
    """An outgoing call's URL (a webhook's, which may carry a secret in its path or query) is
    kept as its origin only."""
    url = getattr(request, "url", None)  # httpx's RequestInfo: an httpx.URL, or its raw tuple
    if url is None or not span.is_recording():
        return
    if isinstance(url, tuple):
        scheme, host, port = (part.decode() if isinstance(part, bytes) else part for part in url[:3])
    else:
        scheme, host, port = url.scheme, url.host, url.port
    origin = f"{scheme}://{host}" + (f":{port}" if port else "")
    for key in ("http.url", "url.full"):
        span.set_attribute(key, origin + "/…")


# A W3C traceparent, as the interrupt's column keeps it (55 characters).
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def traceparent() -> str:
    """The current span's context as a W3C ``traceparent`` header ("" when tracing is off or
    no span is recording): what the interrupt keeps of its pause."""
    if not _on:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    header = carrier.get("traceparent", "")
    return header if _TRACEPARENT.fullmatch(header) else ""


def context_of(header: str) -> context.Context | None:
    """The context a ``traceparent`` names, to continue its trace (None when empty or not one)."""
    if not header or not _on:
        return None
    found = _propagator.extract({"traceparent": header})
    return found if trace.get_current_span(found).get_span_context().is_valid else None


Attributes = Mapping[str, Any] | Callable[[], Mapping[str, Any]]
_OFF = nullcontext(trace.INVALID_SPAN)  # what span() is with traces off: nothing to make


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    parent: str = "",
    kind: SpanKind = SpanKind.INTERNAL,
    expected: tuple[type[BaseException], ...] = (),
) -> AbstractContextManager[Span]:
    """A span of the engine's or the notifier's; with ``parent`` (a traceparent kept on a row),
    in that trace, linked to the span current here (the request or task that does it).
    ``attributes`` may be a function, called only with traces on. An exception of the
    ``expected`` kinds (a refusal) is said in ``grundlag.refused``, not as the span's error."""
    if not _on:
        return _OFF
    return _span(name, attributes, parent, kind, expected)


@contextmanager
def _span(
    name: str,
    attributes: Attributes | None,
    parent: str,
    kind: SpanKind,
    expected: tuple[type[BaseException], ...],
) -> Iterator[Span]:
    given = attributes() if callable(attributes) else (attributes or {})
    here = trace.get_current_span().get_span_context()
    links = [Link(here)] if parent and here.is_valid else None
    with tracer.start_as_current_span(
        name,
        context=context_of(parent),
        kind=kind,
        attributes={key: value for key, value in given.items() if value is not None},
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except expected as exc:
            current.set_attribute("grundlag.refused", type(exc).__name__)
            raise
        except BaseException as exc:
            current.record_exception(exc)
            current.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


@contextmanager
def detached() -> Iterator[None]:
    """No trace is current in this block: work done here for others (a run whose turn came,
    handed on when another's step ended) starts traces of its own, not the other's."""
    if not _on:
        yield
        return
    token = context.attach(Context())
    try:
        yield
    finally:
        context.detach(token)


def carry(function: Callable[..., T]) -> Callable[..., T]:
    """``function``, to run in another thread in the context current here (the embedded
    setup's threads: a step handed on from a request runs in the request's trace)."""
    if not _on:
        return function
    here = context.get_current()

    def carried(*args: Any, **kwargs: Any) -> T:
        token = context.attach(here)
        try:
            return function(*args, **kwargs)
        finally:
            context.detach(token)

    return carried


class JsonFormatter(logging.Formatter):
    """One JSON object a line (GRUNDLAG_LOG_FORMAT=json): time, level, logger, message, the
    trace and span ids of the span current when it was logged, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        current = trace.get_current_span().get_span_context()
        if current.is_valid:
            line["trace_id"] = format(current.trace_id, "032x")
            line["span_id"] = format(current.span_id, "016x")
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
