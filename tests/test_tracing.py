"""actions.tracing without a collector: off by default, its JSON log lines, its spans' context."""

from __future__ import annotations

import json
import logging

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
