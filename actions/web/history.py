"""The audit history's page and its exports (CSV and JSON Lines: the interrupts, or the event
log of their runs, each export recorded); what they read is actions.reads.history."""

from __future__ import annotations

import hashlib
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseForbidden,
    HttpResponseNotFound,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import render

from actions.models import AuditCheck, AuditExport, Interrupt, Run, Team
from actions.reads.history import (
    EVENT_COLUMNS,
    INTERRUPT_COLUMNS,
    PAGE_SIZE,
    STATS_CACHE_SECONDS,
    Refused,
    bar_chart,
    deadlines,
    decision_times,
    event_records,
    filtered,
    interrupt_records,
    lines,
    page,
    reviewer_chart,
    reviewers,
    scope,
)


def _refused(exc: Refused) -> HttpResponse:
    return HttpResponseForbidden(str(exc), content_type="text/plain")


@login_required
def history(request: HttpRequest) -> HttpResponse:
    teams = scope(request.user)
    try:
        interrupts, applied = filtered(request.GET, teams)
    except Refused as exc:
        return _refused(exc)
    # The page's rows, read by the search's plan for a page (the figures read every match).
    after = request.GET.get("after", "")
    for_page, _ = filtered(request.GET, teams, newest=PAGE_SIZE + 1, after=after)
    rows, next_cursor = page(for_page, after)
    requested = request.GET.get("days", "")
    days = min(max(int(requested), 1), 3650) if requested.isdigit() and len(requested) < 6 else 30
    # The figures read every decision in the period; an audit page can show them a minute old.
    key = (
        "history-figures:" + hashlib.sha256(repr((sorted(applied.items()), days, teams)).encode()).hexdigest()
    )
    figures = cache.get(key)
    if figures is None:
        figures = (
            decision_times(interrupts, "team", days),
            decision_times(interrupts, "action", days),
            reviewers(interrupts, days),
            deadlines(interrupts, days),
        )
        cache.set(key, figures, STATS_CACHE_SECONDS)
    by_team, by_action, people, missed = figures
    query = request.GET.copy()
    query.pop("after", None)
    context = {
        "rows": rows,
        "next_cursor": next_cursor,
        "applied": applied,
        "query": query.urlencode(),
        "teams": Team.objects.all() if teams is None else Team.objects.filter(pk__in=teams),
        "statuses": [
            (value, label)
            for value, label in Interrupt.Status.choices
            if teams is None or value != Interrupt.Status.PENDING
        ],
        "consumers": Run.Consumer.choices,
        "days": days,
        "by_team": bar_chart(by_team),
        "by_action": bar_chart(by_action),
        "chart_height": 24 * max(len(by_action), 1),
        "people": people,
        "people_chart": reviewer_chart(people),
        "people_height": 24 * max(min(len(people), 20), 1),
        "deadlines": missed,
        "verified": AuditCheck.objects.order_by("-at", "-id").first(),
        "everything": teams is None,
    }
    return render(request, "actions/history.html", context)


def _export(request: HttpRequest, what: str, fmt: str) -> HttpResponseBase:
    if fmt not in ("csv", "jsonl"):
        return HttpResponseNotFound("Exports are .csv or .jsonl.", content_type="text/plain")
    teams = scope(request.user)
    try:
        interrupts, applied = filtered(request.GET, teams)
    except Refused as exc:
        return _refused(exc)
    # The export is itself audited: who took what, when.
    AuditExport.objects.create(
        user=request.user if request.user.is_authenticated else None,
        user_name=request.user.get_username(),
        what=what,
        format=fmt,
        filters={key: value for key, value in applied.items() if value}
        | ({} if teams is None else {"teams": teams}),
    )
    if what == "events":
        body = lines(event_records(interrupts, teams), EVENT_COLUMNS, fmt)
    else:
        body = lines(interrupt_records(interrupts), INTERRUPT_COLUMNS, fmt)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    content_type = "text/csv; charset=utf-8" if fmt == "csv" else "application/jsonl; charset=utf-8"
    response = StreamingHttpResponse(body, content_type=content_type)
    name = "history" if what == "interrupts" else "events"
    response["Content-Disposition"] = f'attachment; filename="grundlag-{name}-{stamp}.{fmt}"'
    return response


@login_required
def export_interrupts(request: HttpRequest, fmt: str) -> HttpResponseBase:
    """The filtered history, one interrupt a row, streamed: memory stays flat at any size."""
    return _export(request, "interrupts", fmt)


@login_required
def export_events(request: HttpRequest, fmt: str) -> HttpResponseBase:
    """The event log of the filtered interrupts' runs, every event with its hashes."""
    return _export(request, "events", fmt)
