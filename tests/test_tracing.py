"""actions.tracing without a collector: off by default, its JSON log lines, its spans' context."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from actions import tracing


def test_off_without_an_endpoint_spans_cost_nothing_and_keep_no_context() -> None:
    assert not tracing.enabled()
    with tracing.span("grundlag.pause", {"grundlag.run.id": 1}) as span:
        assert not span.is_recording()
        assert tracing.traceparent() == ""
    assert tracing.context_of("00-" + "1" * 32 + "-" + "2" * 16 + "-01") is None
    assert tracing.carry(len) is len


def test_a_json_log_line_carries_the_trace_and_span_of_its_span() -> None:
    formatter = tracing.JsonFormatter()
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        record = logging.LogRecord("actions", logging.WARNING, __file__, 1, "run %s: %s", (7, "slow"), None)
        line = json.loads(formatter.format(record))
    context = span.get_span_context()
    assert line["message"] == "run 7: slow" and line["level"] == "WARNING" and line["logger"] == "actions"
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")
    assert line["time"].endswith("+00:00")


def test_a_json_log_line_outside_a_span_has_no_ids_and_keeps_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("actions", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = json.loads(tracing.JsonFormatter().format(record))
    assert "trace_id" not in line and "ValueError: boom" in line["exception"]


def test_the_log_format_setting_is_text_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from grundlag_site import settings

    monkeypatch.setenv("GRUNDLAG_LOG_FORMAT", "xml")
    with pytest.raises(ImproperlyConfigured, match="GRUNDLAG_LOG_FORMAT must be one of json, text"):
        settings.envchoice("GRUNDLAG_LOG_FORMAT", "text", {"text", "json"})


# With traces on: a tracer of a provider of the test's own, its spans kept in memory.


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Any:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_on", True)
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("grundlag"))
    return exporter


def test_a_pause_kept_as_a_traceparent_is_continued_by_its_decision_linked_to_its_request(spans: Any) -> None:
    with tracing.span("grundlag.pause", lambda: {"grundlag.interrupt.id": 7, "gone": None}):
        kept = tracing.traceparent()
    assert len(kept) == 55 and kept.startswith("00-")
    with tracing.span("request"), tracing.span("grundlag.decision", parent=kept):
        pass
    made = {each.name: each for each in spans.get_finished_spans()}
    pause, request, decision = made["grundlag.pause"], made["request"], made["grundlag.decision"]
    assert decision.context.trace_id == pause.context.trace_id != request.context.trace_id
    assert decision.parent.span_id == pause.context.span_id
    assert [link.context.span_id for link in decision.links] == [request.context.span_id]
    assert dict(pause.attributes) == {"grundlag.interrupt.id": 7}, "None is left out"


def test_a_refusal_is_said_not_an_error_and_an_unexpected_exception_is_one(spans: Any) -> None:
    from opentelemetry.trace import StatusCode

    with pytest.raises(PermissionError), tracing.span("grundlag.decision", expected=(PermissionError,)):
        raise PermissionError("not yours")
    with pytest.raises(KeyError), tracing.span("grundlag.decision", expected=(PermissionError,)):
        raise KeyError("bug")
    refused, failed = spans.get_finished_spans()
    assert (
        refused.attributes["grundlag.refused"] == "PermissionError"
        and refused.status.status_code == StatusCode.UNSET
    )
    assert failed.status.status_code == StatusCode.ERROR and failed.events[0].name == "exception"


def test_work_handed_on_carries_the_trace_and_work_for_others_is_detached(spans: Any) -> None:
    from opentelemetry import trace

    seen: list[int] = []
    with tracing.span("step") as step:
        carried = tracing.carry(lambda: seen.append(trace.get_current_span().get_span_context().trace_id))
        with tracing.detached():
            assert not trace.get_current_span().get_span_context().is_valid
            assert tracing.traceparent() == ""
    carried()  # as another thread would, after the step
    assert seen == [step.get_span_context().trace_id]
    assert not trace.get_current_span().get_span_context().is_valid


def test_an_unreadable_traceparent_continues_nothing(spans: Any) -> None:
    assert tracing.context_of("00-zz-yy-01") is None
    assert tracing.context_of("") is None


def test_a_client_chooses_no_trace_but_celery_messages_carry_theirs() -> None:
    from opentelemetry.instrumentation.asgi import asgi_getter
    from opentelemetry.instrumentation.wsgi import wsgi_getter
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = tracing.NotFromHttpClients(TraceContextTextMapPropagator(), (asgi_getter, wsgi_getter))
    chosen = "00-" + "a" * 32 + "-" + "b" * 16 + "-00"
    from_client = propagator.extract({"HTTP_TRACEPARENT": chosen}, getter=wsgi_getter)
    assert not get_current_span(from_client).get_span_context().is_valid
    scope = {"headers": [(b"traceparent", chosen.encode())]}
    assert not get_current_span(propagator.extract(scope, getter=asgi_getter)).get_span_context().is_valid
    from_message = propagator.extract({"traceparent": chosen})
    assert format(get_current_span(from_message).get_span_context().trace_id, "032x") == "a" * 32


def test_a_mail_links_token_and_a_webhooks_path_never_leave_in_a_span(spans: Any) -> None:
    import httpx
    from django.test import RequestFactory
    from opentelemetry.instrumentation.httpx import RequestInfo

    link = "/d/WzIsMiwxXQ:secret/"
    with tracing.span("GET", {"http.target": link, "http.url": "http://h" + link}) as span:
        tracing.redact_request(span, RequestFactory().get(link))
        call = httpx.Request("POST", "https://hooks.example.com:8443/services/T0/B0/secret?token=x")
        tracing.redact_call(span, RequestInfo(call.method.encode(), call.url, call.headers, None, {}))
    with tracing.span("POST", {"http.url": "https://h.example.com/secret"}) as raw:
        raw_url = (b"https", b"h.example.com", None, b"/secret")
        tracing.redact_call(raw, RequestInfo(b"POST", raw_url, None, None, {}))
    made, raw_made = spans.get_finished_spans()
    assert raw_made.attributes["http.url"] == "https://h.example.com/…"
    assert made.attributes["http.target"] == "/d/{token}/"
    assert "secret" not in str(dict(made.attributes))
    assert made.attributes["http.url"] == "https://hooks.example.com:8443/…"
