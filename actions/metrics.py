"""What production watches, in Prometheus's format (prometheus-client).

Two kinds of figure:

- Read from the database when scraped, so every process tells the same truth: pending
  interrupts per team.
- Counted by the process where it happens, from the engine's signals and the web layer:
  decisions and time to decision (where the decision commits), step duration and queue wait
  (where the step runs), push fan-out time and open sockets (web processes).

The embedded setup is one process: `/metrics` has all of them. In the scaled one each web
process serves its own at `/metrics`, and each Celery worker its own on the address in
GRUNDLAG_WORKER_METRICS_ADDR (host:port; off when empty), which Prometheus scrapes beside them.
That listener has no token (prometheus-client's server): bind it to a private address. It
serves step, queue and decision figures only, never the per-team counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from actions.engine import journal
from actions.models import Interrupt, Team

logger = logging.getLogger(__name__)

# Buckets in seconds, from a click to a working day.
_HUMAN = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 8 * 3600, 24 * 3600, 7 * 24 * 3600)
_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

DECISIONS = Counter("grundlag_decisions", "Interrupts decided, by team and outcome", ["team", "outcome"])
TIME_TO_DECISION = Histogram(
    "grundlag_time_to_decision_seconds",
    "From an interrupt's creation to its decision",
    ["team"],
    buckets=_HUMAN,
)
STEP_SECONDS = Histogram(
    "grundlag_step_seconds",
    "How long a step of a run took, by action and outcome",
    ["action", "status"],
    buckets=_FAST,
)
QUEUE_WAIT = Histogram(
    "grundlag_queue_wait_seconds", "From a step's message being sent to a worker claiming it", buckets=_FAST
)
PUSH_FANOUT = Histogram(
    "grundlag_push_fanout_seconds",
    "Rendering a transaction's inbox changes once and handing them to every team's stream",
    buckets=_FAST,
)
OPEN_SOCKETS = Gauge("grundlag_open_sockets", "Reviewers' websockets open in this process")


class PendingCollector(Collector):
    """Pending interrupts per team, counted by the database when scraped."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # Named without a query: registering must not touch the database (it may not exist yet).
        yield GaugeMetricFamily("grundlag_pending_interrupts", "", labels=["team"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "grundlag_pending_interrupts", "Interrupts waiting for a decision, by team", labels=["team"]
        )
        counts = dict(
            Interrupt.objects.filter(status=Interrupt.Status.PENDING)
            .values_list("team_id")
            .annotate(n=Count("id"))
            .values_list("team_id", "n")
        )
        for pk, slug in Team.objects.values_list("pk", "slug"):
            family.add_metric([slug], counts.get(pk, 0))
        yield family


_slugs: dict[int, str] = {}


def _slug(team_id: int) -> str:
    if team_id not in _slugs:
        _slugs.update(Team.objects.values_list("pk", "slug"))
    return _slugs.get(team_id, str(team_id))


def on_team_changed(sender: Any, *, changes: list[Any], **kwargs: Any) -> None:
    """Decisions, counted where they commit (actions.engine.journal.team_changed)."""
    try:
        now = timezone.now()
        for change in changes:
            if change.event != "decided":
                continue
            team = _slug(change.before[0]) if change.before else ""
            DECISIONS.labels(team=team, outcome=change.status).inc()
            if change.created_at is not None:
                TIME_TO_DECISION.labels(team=team).observe(
                    max(0.0, (now - change.created_at).total_seconds())
                )
    except Exception:
        logger.warning("could not count a decision", exc_info=True)


def on_step_ran(
    sender: Any, *, action: str, status: str, seconds: float, queued_seconds: float | None, **kwargs: Any
) -> None:
    STEP_SECONDS.labels(action=action, status=status).observe(seconds)
    if queued_seconds is not None:
        QUEUE_WAIT.observe(queued_seconds)


_registered = False
_pending = PendingCollector()


def register() -> None:
    """Once per process: the database collector and the engine's signals."""
    global _registered
    if _registered:
        return
    REGISTRY.register(_pending)
    journal.team_changed.connect(on_team_changed, dispatch_uid="metrics-decisions")
    journal.step_ran.connect(on_step_ran, dispatch_uid="metrics-steps")
    _registered = True


def serve_worker_metrics(**kwargs: Any) -> None:
    """A Celery worker's own /metrics, on GRUNDLAG_WORKER_METRICS_ADDR (Celery's worker_init)."""
    address = settings.GRUNDLAG_WORKER_METRICS_ADDR
    if not address:
        return
    # A worker's own figures only: the database's (pending per team) are the web processes',
    # behind their token, and each scrape of them would cost this worker queries.
    REGISTRY.unregister(_pending)
    host, _, port = address.rpartition(":")
    try:
        start_http_server(int(port), addr=host or "127.0.0.1")
    except (OSError, ValueError):
        # A second worker on the same machine and port: it still works, unwatched.
        logger.exception("cannot serve worker metrics on %s", address)
        return
    logger.info("worker metrics on http://%s/metrics", address)
