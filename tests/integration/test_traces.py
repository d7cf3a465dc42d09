"""Traces, as an operator's collector receives them (OTLP/HTTP, decoded with the protocol's
own message types): one approval is one trace, from the request that starts the run, through
its step and pause, each notification's delivery, to the decision and the resumed step, across
the processes that do them: the embedded server and its notifier, or daphne and Celery's
workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.otlp_receiver import OtlpReceiver, Span
from tests.integration.processes import Server, Site, wait_for
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.integration

SERVER = 2  # Span.SpanKind.SPAN_KIND_SERVER
CHOSEN = "00-" + "c" * 32 + "-" + "d" * 16 + "-00"  # a trace a client would choose, unsampled
LINK_TOKEN = "WzEsMSwxXQ:1vSecretPart:abcdefTOKENSECRET"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.stop()


def traced(site: Site, otlp: OtlpReceiver) -> None:
    site.env.update(
        GRUNDLAG_WEBHOOK_ALLOW_PRIVATE="true",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="100",  # ms: spans reach the collector promptly
        OTEL_SERVICE_NAME="grundlag-test",
    )


def an_approval(web: Server, token: str, receiver: Receiver) -> dict[str, Any]:
    with web.client(token) as api:
        hook = api.post("/api/webhooks", json={"url": receiver.url, "events": ["interrupt.created"]})
        assert hook.status_code == 201, hook.text
        run = api.post(
            "/api/runs",
            json={"action": "send_invoice", "input": {"invoice_id": "T-1", "amount": 1}},
            # A client's own trace context is not taken (it would choose the trace's id and
            # whether it is sampled, for the decision and the notifications too).
            headers={"Prefer": "wait=20", "traceparent": CHOSEN},
        ).json()
        assert run["status"] == "interrupted", run
        wait_for(lambda: receiver.received or None, timeout=20, what="the webhook of the new interrupt")
        done = api.post(
            run["interrupt"]["resume_url"], json={"data": {"approved": True}}, headers={"Prefer": "wait=20"}
        ).json()
        assert done["status"] == "completed", done
        # A mail's decision link (here one that is no link: its token is checked after the span began).
        api.get(f"/d/{LINK_TOKEN}/")
        return dict(run)


def serving(span: Span, path: str) -> bool:
    return span.kind == SERVER and any(isinstance(v, str) and path in v for v in span.attributes.values())


def the_trace_of_an_approval(otlp: OtlpReceiver, run: dict[str, Any]) -> None:
    interrupt_id = run["interrupt"]["id"]

    def complete() -> bool | None:
        steps = [s for s in otlp.named("grundlag.step") if s.attributes.get("grundlag.run.id") == run["id"]]
        hooks = [
            s
            for s in otlp.named("grundlag.notify")
            if s.attributes["grundlag.notification.channel"] == "webhook"
        ]
        decisions = otlp.named("grundlag.decision")
        # The request that decided ends (and is exported) after the decision's span.
        linked = decisions and {link[1] for link in decisions[0].links} <= {s.span_id for s in otlp.spans}
        return (len(steps) == 2 and bool(linked) and bool(hooks)) or None

    wait_for(complete, timeout=30, what="the approval's spans at the collector")
    wait_for(
        lambda: [s for s in otlp.spans if serving(s, "/d/")] or None, timeout=30, what="the link's request"
    )
    assert "c" * 32 not in {s.trace_id for s in otlp.spans}, "the client's trace was taken"
    assert not [s for s in otlp.spans if LINK_TOKEN in str(s.attributes)], "a link's token left in a span"
    assert [s for s in otlp.spans if serving(s, "/d/{token}/")], "the link's request, its token redacted"
    (pause,) = otlp.named("grundlag.pause")
    (decision,) = otlp.named("grundlag.decision")
    # The demo team's reviewers are mailed, and the webhook called: each delivery a span.
    deliveries = {s.attributes["grundlag.notification.channel"]: s for s in otlp.named("grundlag.notify")}
    delivery = deliveries["webhook"]
    first, resumed = sorted(otlp.named("grundlag.step"), key=lambda s: s.attributes["grundlag.attempt"])
    trace = pause.trace_id
    started = [s for s in otlp.spans if serving(s, "/api/runs") and s.trace_id == trace and not s.parent_id]
    assert started, "the request that started the run is the trace's root"
    by_id = {s.span_id: s for s in otlp.spans}

    def ancestors(span: Span) -> list[str]:
        names = []
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
            names.append(span.name)
        return names

    # The step, in the request's trace (across the thread or the Celery message), and the pause in it.
    assert first.trace_id == trace and started[0].name in ancestors(first)
    assert pause.parent_id == first.span_id or first.name in ancestors(pause)
    assert pause.attributes["grundlag.interrupt.id"] == interrupt_id
    assert pause.attributes["grundlag.action"] == "send_invoice"
    # The webhook's delivery, made in another process, continues the pause's trace.
    assert delivery.trace_id == trace and delivery.parent_id == pause.span_id
    assert delivery.resource["process.pid"] != first.resource["process.pid"]
    assert deliveries["email"].parent_id == pause.span_id
    # Its HTTP call (httpx's instrumentation) inside it.
    assert any(
        s.parent_id == delivery.span_id and s.attributes.get("http.method") == "POST" for s in otlp.spans
    )
    # The decision, minutes later in another request, continues it too, linked to that request.
    assert decision.trace_id == trace and decision.parent_id == pause.span_id
    assert decision.attributes["grundlag.interrupt.id"] == interrupt_id
    assert decision.attributes["grundlag.decided_via"] == "api"
    assert decision.attributes["grundlag.decided_by"].startswith("API token")
    assert decision.attributes["grundlag.interrupt.status"] == "approved"
    assert decision.attributes["grundlag.waited_seconds"] > 0
    (link,) = decision.links
    resume_request = by_id[link[1]]
    assert serving(resume_request, "/resume") and resume_request.trace_id != trace
    # And the resumed step is the decision's.
    assert resumed.trace_id == trace and "grundlag.decision" in ancestors(resumed)
    assert resumed.attributes["grundlag.run.status"] == "completed"


def test_an_approval_is_one_trace_across_the_embedded_server_and_its_notifier(
    site: Site, otlp: OtlpReceiver, receiver: Receiver
) -> None:
    traced(site, otlp)
    run = an_approval(site.serve(), site.token, receiver)
    the_trace_of_an_approval(otlp, run)


def test_an_approval_is_one_trace_across_daphne_and_celery_workers(
    scaled_site: Site, otlp: OtlpReceiver, receiver: Receiver
) -> None:
    traced(scaled_site, otlp)
    web = scaled_site.web()
    scaled_site.worker("steps", queues="celery")
    scaled_site.worker("notify", queues="notify")
    run = an_approval(web, scaled_site.token, receiver)
    the_trace_of_an_approval(otlp, run)
    # PostgreSQL's statements are spans of the same traces (psycopg's instrumentation).
    assert any(span.attributes.get("db.system") == "postgresql" for span in otlp.spans)


def test_without_an_endpoint_the_interrupts_keep_no_trace(site: Site, receiver: Receiver) -> None:
    site.env["GRUNDLAG_WEBHOOK_ALLOW_PRIVATE"] = "true"
    run = an_approval(site.serve(), site.token, receiver)
    kept = site.sql("SELECT traceparent FROM actions_interrupt WHERE id = %s", run["interrupt"]["id"])
    assert kept == [(None,)]
