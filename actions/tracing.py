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

Nothing here imports the project: any layer may use ``span``, ``context_of`` and ``carry``.
Without the SDK installed (tracing off) they cost a few attribute reads.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from opentelemetry import context, trace
from opentelemetry.trace import Link, Span, SpanKind
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
    # Imported here: a process without an endpoint never loads the SDK or the instrumentations.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.instrumentation.celery import CeleryInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.django import DjangoInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor  # noqa: PLC0415
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor  # noqa: PLC0415
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
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    PsycopgInstrumentor().instrument(enable_commenter=False)
    HTTPXClientInstrumentor().instrument()
    _on = True
    return True


def shutdown() -> None:
    """Export what is buffered (a process that exits: the notifier, a command)."""
    provider = trace.get_tracer_provider()
    if _on and hasattr(provider, "shutdown"):
        provider.shutdown()


def traceparent() -> str:
    """The current span's context as a W3C ``traceparent`` header ("" when tracing is off or
    no span is recording): what the interrupt keeps of its pause."""
    if not _on:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def context_of(header: str) -> context.Context | None:
    """The context a ``traceparent`` names, to continue its trace (None when empty)."""
    if not header or not _on:
        return None
    return _propagator.extract({"traceparent": header})


@contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: str = "",
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A span of the engine's or the notifier's; with ``parent`` (a traceparent kept on a row),
    in that trace, linked to the span current here (the request or task that does it)."""
    if not _on:
        yield trace.INVALID_SPAN
        return
    here = trace.get_current_span().get_span_context()
    links = [Link(here)] if parent and here.is_valid else None
    with tracer.start_as_current_span(
        name,
        context=context_of(parent),
        kind=kind,
        attributes={key: value for key, value in (attributes or {}).items() if value is not None},
        links=links,
    ) as current:
        yield current


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
