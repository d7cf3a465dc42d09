"""The audit history for staff: every interrupt ever, filtered, paged by keyset, exported as CSV,
and the time reviewers take to decide."""

from __future__ import annotations

import csv
import hashlib
import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.core.cache import cache
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from actions.models import Interrupt, Run, Team

PAGE_SIZE = 50
STATS_CACHE_SECONDS = 60
CSV_COLUMNS = [
    "interrupt_id", "run_id", "seq", "team", "action", "consumer", "status", "message",
    "created_at", "decided_by", "decided_at", "reason",
]  # fmt: skip


def filtered(params: Any) -> tuple[QuerySet[Interrupt], dict[str, str]]:
    """The interrupts matching the query parameters, newest first, and the filters applied."""
    applied = {
        key: params.get(key, "").strip()
        for key in ("team", "action", "consumer", "status", "decided_by", "since", "until", "q")
    }
    interrupts = Interrupt.objects.select_related("run", "team").order_by("-created_at", "-id")
    if applied["team"]:
        interrupts = interrupts.filter(team__slug=applied["team"])
    if applied["action"]:
        interrupts = interrupts.filter(action=applied["action"])
    if applied["consumer"]:
        interrupts = interrupts.filter(run__consumer=applied["consumer"])
    if applied["status"]:
        interrupts = interrupts.filter(status=applied["status"])
    if applied["decided_by"]:
        interrupts = interrupts.filter(decided_by_name=applied["decided_by"])
    since, until = _date(applied["since"]), _date(applied["until"])
    # A date that is not one (2024-02-30) filters nothing, and the form shows it empty.
    applied["since"], applied["until"] = (str(since) if since else ""), (str(until) if until else "")
    if since:
        interrupts = interrupts.filter(created_at__date__gte=since)
    if until:
        interrupts = interrupts.filter(created_at__date__lte=until)
    if applied["q"]:
        interrupts = interrupts.filter(message__icontains=applied["q"])
    return interrupts, applied


def _date(text: str) -> date | None:
    try:
        return parse_date(text)
    except ValueError:  # well-formed, but no such day
        return None


def _moment(text: str) -> datetime | None:
    try:
        moment = parse_datetime(text)
    except ValueError:
        return None
    if moment is not None and timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_current_timezone())
    return moment


def _page(interrupts: QuerySet[Interrupt], cursor: str) -> tuple[list[Interrupt], str]:
    """One page after ``cursor`` ("<created_at>|<id>" of the last row seen). Keyset paging costs
    the same on page 1 and page 2,000: no OFFSET, just an index range."""
    if "|" in cursor:
        stamp, _, last_id = cursor.partition("|")
        after = _moment(stamp)
        if after is not None and last_id.isascii() and last_id.isdigit() and len(last_id) < 19:
            interrupts = interrupts.filter(Q(created_at__lt=after) | Q(created_at=after, id__lt=int(last_id)))
    rows = list(interrupts[: PAGE_SIZE + 1])
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    next_cursor = f"{rows[-1].created_at.isoformat()}|{rows[-1].pk}" if more else ""
    return rows, next_cursor


@dataclass(frozen=True)
class DecisionTimes:
    label: str
    count: int
    median: float
    p90: float


def decision_times(interrupts: QuerySet[Interrupt], key: str, days: int) -> list[DecisionTimes]:
    """Median and 90th percentile of seconds from pause to decision, per team or per action."""
    since = timezone.now() - timedelta(days=days)
    field = "team__name" if key == "team" else "action"
    rows = (
        interrupts.filter(decided_at__isnull=False, created_at__gte=since)
        .exclude(decided_by_name="")
        .order_by()
        .values_list(field, "created_at", "decided_at")
    )
    seconds: dict[str, list[float]] = defaultdict(list)
    for label, created, decided in rows.iterator(chunk_size=5000):
        seconds[label].append(max((decided - created).total_seconds(), 0.0))
    result = []
    for label, values in sorted(seconds.items()):
        values.sort()
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        result.append(DecisionTimes(label, len(values), statistics.median(values), p90))
    return result


def human(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def bar_chart(times: list[DecisionTimes]) -> list[dict[str, Any]]:
    """Geometry for a server-rendered SVG: one row per label, median bar over a p90 bar."""
    longest = max((t.p90 for t in times), default=0) or 1
    return [
        {
            "label": t.label,
            "y": 24 * i,
            "median_width": round(300 * t.median / longest, 1),
            "p90_width": round(300 * t.p90 / longest, 1),
            "median": human(t.median),
            "p90": human(t.p90),
            "count": t.count,
        }
        for i, t in enumerate(times)
    ]


@staff_member_required
def history(request: HttpRequest) -> HttpResponse:
    interrupts, applied = filtered(request.GET)
    rows, next_cursor = _page(interrupts, request.GET.get("after", ""))
    requested = request.GET.get("days", "")
    days = min(max(int(requested), 1), 3650) if requested.isdigit() else 30
    # The figures read every decision in the period; an audit page can show them a minute old.
    key = "history-times:" + hashlib.sha256(repr((sorted(applied.items()), days)).encode()).hexdigest()
    times = cache.get(key)
    if times is None:
        times = (decision_times(interrupts, "team", days), decision_times(interrupts, "action", days))
        cache.set(key, times, STATS_CACHE_SECONDS)
    by_team, by_action = times
    query = request.GET.copy()
    query.pop("after", None)
    context = {
        "rows": rows,
        "next_cursor": next_cursor,
        "applied": applied,
        "query": query.urlencode(),
        "teams": Team.objects.all(),
        "statuses": Interrupt.Status.choices,
        "consumers": Run.Consumer.choices,
        "days": days,
        "by_team": bar_chart(by_team),
        "by_action": bar_chart(by_action),
        "chart_height": 24 * max(len(by_action), 1),
    }
    return render(request, "actions/history.html", context)


# A cell a spreadsheet would run as a formula (OWASP "CSV injection"): prefixed with a quote,
# which spreadsheets show as text. Reviewer text, messages and names are all somebody's input.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_rows(interrupts: QuerySet[Interrupt]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for it in interrupts.iterator(chunk_size=2000):
        yield writer.writerow(
            neutralise(cell)
            for cell in [
                it.pk,
                it.run_id,
                it.seq,
                it.team.slug,
                it.action,
                it.run.consumer,
                it.status,
                it.message,
                it.created_at.isoformat(),
                it.decided_by_name,
                it.decided_at.isoformat() if it.decided_at else "",
                it.reason,
            ]  # fmt: skip
        )


@staff_member_required
def export_csv(request: HttpRequest) -> StreamingHttpResponse:
    """The filtered history as CSV, streamed row by row: memory stays flat at any size."""
    interrupts, _ = filtered(request.GET)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    response = StreamingHttpResponse(_csv_rows(interrupts), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="grundlag-history-{stamp}.csv"'
    return response
