"""Reading the audit history (the history page, its exports, the API's /history, MCP's task
list): every interrupt ever for staff, a team's decided ones for its members; filtered and
searched (full text, by the database), paged by keyset; the time reviewers take to decide, per
reviewer, and the deadlines missed; the records the exports and the API give of each."""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.db.models import Count, F, Model, Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from actions.engine import store
from actions.models import Interrupt, Role, RunEvent, Team

PAGE_SIZE = 50
M = TypeVar("M", bound=Model)
STATS_CACHE_SECONDS = 60
FILTERS = ("team", "action", "consumer", "status", "decided_by", "run", "since", "until", "q")


class Refused(Exception):
    """A filter that asks for what the user may not see (another team's history)."""


def scope(user: Any) -> list[int] | None:
    """The teams whose history ``user`` may read (in any role: an auditor's are the teams they
    audit): None for staff (all of it)."""
    if user.is_staff:
        return None
    return list(Team.where(user, Role.READ).values_list("pk", flat=True))


def filtered(
    params: Any, teams: list[int] | None = None, *, newest: int | None = None, after: str = ""
) -> tuple[QuerySet[Interrupt], dict[str, str]]:
    """The interrupts matching the query parameters, newest first, and the filters applied.
    ``teams``: only those teams' decided interrupts (a member's view); None: all (staff).
    ``newest``: the caller reads that many at most (a page), after the cursor ``after``: the
    query is planned for that read (``_visible``, ``searched``): on SQLite, a member's reads only
    what that page needs (the newest after the cursor) where it can, not every match.
    Raises Refused for a team outside ``teams``."""
    applied = {key: str(params.get(key, "")).strip() for key in FILTERS}
    interrupts = everything = Interrupt.objects.select_related("run", "team").order_by("-created_at", "-id")
    if teams is not None:
        interrupts = interrupts.exclude(status=Interrupt.Status.PENDING)
    if applied["team"]:
        if teams is not None and not Team.objects.filter(pk__in=teams, slug=applied["team"]).exists():
            raise Refused(f"You may read the history of your own teams only, not of {applied['team']!r}.")
        interrupts = interrupts.filter(team__slug=applied["team"])
    if applied["action"]:
        interrupts = interrupts.filter(action=applied["action"])
    if applied["consumer"]:
        interrupts = interrupts.filter(run__consumer=applied["consumer"])
    if applied["status"]:
        interrupts = interrupts.filter(status=applied["status"])
    if applied["decided_by"]:
        interrupts = interrupts.filter(decided_by_name=applied["decided_by"])
    run = applied["run"].lstrip("#")
    if run:
        valid = run.isascii() and run.isdigit() and len(run) < 19
        interrupts = interrupts.filter(run_id=int(run)) if valid else interrupts.none()
    since, until = _date(applied["since"]), _date(applied["until"])
    # A date that is not one (2024-02-30) filters nothing, and the form shows it empty.
    applied["since"], applied["until"] = (str(since) if since else ""), (str(until) if until else "")
    if since:
        interrupts = interrupts.filter(created_at__date__gte=since)
    if until:
        interrupts = interrupts.filter(created_at__date__lte=until)
    if applied["q"] and (teams is None or not _split(newest)):
        interrupts = searched(interrupts, applied["q"], newest if teams is None else None)
    if teams is not None:
        interrupts = _visible(interrupts, teams, newest, after, everything, applied["q"])
    return interrupts, applied


def _split(newest: int | None) -> bool:
    """Whether a member's page is read as two lists (``_visible``)."""
    return newest is not None and connection.vendor == "sqlite"


def _visible(
    interrupts: QuerySet[Interrupt],
    teams: list[int],
    newest: int | None,
    after: str,
    everything: QuerySet[Interrupt],
    text: str = "",
) -> QuerySet[Interrupt]:
    """Those of ``interrupts`` that ``teams`` see: theirs, and those escalated to them. For a
    page (the ``newest`` after the cursor ``after``), each of the two is read on its own,
    ``newest`` at most (theirs newest first by the team's index; the escalated ones, few, by
    theirs, sorted), and the page is made of both: no index holds "theirs or escalated to them"
    in date order, and the database sorted all of a team's history to find the newest (40 ms
    at 100,000 interrupts; 0.2 ms this way). The page is then read from
    ``everything`` by the two lists' ids alone. On SQLite only: PostgreSQL reads the two
    indexes together (a bitmap) and was faster as it was (18 against 26 ms, bench/RESULTS.md).

    Searched (``text``), each list is walked in its order, FTS5 asked of its rows, where that
    pays (``store.first_matching``: for a word most of the team's rows hold, 2 ms against 35 ms
    at 100,000); otherwise the page is read from the search's matches: their ids when they are
    few, or all of them looked up."""
    if not _split(newest):
        return interrupts.filter(Interrupt.visible_to(teams))
    assert newest is not None
    window = _after(interrupts, after)
    lists = [window.filter(why) for why in Interrupt.seen_by(teams)]
    if text:
        found = store.first_matching(lists, text, newest)
        if isinstance(found, Q):  # the matches, to read the page from
            return interrupts.filter(found).filter(Interrupt.visible_to(teams))
        # Read with the filters again (no pending row, the team asked for): cheap by id.
        return interrupts.filter(pk__in=found)
    theirs, escalated = (rows.values("pk")[:newest] for rows in lists)
    return everything.filter(Q(pk__in=theirs) | Q(pk__in=escalated))


def searched(interrupts: QuerySet[Interrupt], text: str, newest: int | None = None) -> QuerySet[Interrupt]:
    """Those whose message, data, answer, reason, comments or run input hold every word of
    ``text``: the database's full-text index (SQLite FTS5, PostgreSQL tsvector with GIN), kept
    by triggers (migration 0015). ``newest``: the caller reads that many at most (a page)."""
    matching = store.interrupts_matching(text, newest)
    return interrupts.none() if matching is None else interrupts.filter(matching)


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


def parse_cursor(cursor: str) -> tuple[datetime, int] | None:
    """The last row seen, from a cursor ("<created_at>|<id>"); None when it is not one."""
    stamp, _, last_id = cursor.partition("|")
    after = _moment(stamp)
    if after is None or not (last_id.isascii() and last_id.isdigit() and len(last_id) < 19):
        return None
    return after, int(last_id)


def page(rows: QuerySet[M], cursor: str, size: int = PAGE_SIZE) -> tuple[list[M], str]:
    """One page (newest first) after ``cursor`` ("<created_at>|<id>" of the last row seen), and
    the cursor of the next ("" on the last). Keyset paging costs the same on page 1 and page
    2,000: no OFFSET, just an index range. A cursor that is not one starts from the top."""
    found = list(_after(rows, cursor)[: size + 1])
    more = len(found) > size
    found = found[:size]
    if not more:
        return found, ""
    last: Any = found[-1]
    # In UTC with a "Z": nothing in it that a query string would need escaped ("+" is a space).
    stamp = last.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return found, f"{stamp}|{last.pk}"


def _after(rows: QuerySet[M], cursor: str) -> QuerySet[M]:
    """The rows after the cursor's, newest first (all of them when it is not a cursor)."""
    if seen := parse_cursor(cursor):
        return rows.filter(Q(created_at__lt=seen[0]) | Q(created_at=seen[0], id__lt=seen[1]))
    return rows


@dataclass(frozen=True)
class DecisionTimes:
    label: str
    count: int
    median: float
    p90: float


def _decided_in(interrupts: QuerySet[Interrupt], days: int) -> QuerySet[Interrupt]:
    """Those asked in the last ``days`` and decided by someone or something, unordered."""
    since = timezone.now() - timedelta(days=days)
    return (
        interrupts.filter(decided_at__isnull=False, created_at__gte=since)
        .exclude(decided_by_name="")
        .order_by()
    )


def decision_times(interrupts: QuerySet[Interrupt], key: str, days: int) -> list[DecisionTimes]:
    """Median and 90th percentile of seconds from pause to decision, per team or per action."""
    field = "team__name" if key == "team" else "action"
    rows = _decided_in(interrupts, days).values_list(field, "created_at", "decided_at")
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


@dataclass(frozen=True)
class Reviewer:
    name: str
    decisions: int
    median: float
    rejected: float  # share, 0..1


def reviewers(interrupts: QuerySet[Interrupt], days: int) -> list[Reviewer]:
    """Per person who decided in the period: how many, the median time to decision, and the
    share rejected (decisions by a deadline, a policy, a rule or a grant are nobody's)."""
    rows = (
        _decided_in(interrupts, days)
        .exclude(decided_via__in=["deadline", "policy", "rule", "grant"])
        .values_list("decided_by_name", "status", "created_at", "decided_at")
    )
    seconds: dict[str, list[float]] = defaultdict(list)
    rejected: dict[str, int] = defaultdict(int)
    for name, status, created, decided in rows.iterator(chunk_size=5000):
        assert decided is not None  # filtered above
        seconds[name].append(max((decided - created).total_seconds(), 0.0))
        rejected[name] += status == Interrupt.Status.REJECTED
    return [
        Reviewer(name, len(values), statistics.median(values), rejected[name] / len(values))
        for name, values in sorted(seconds.items(), key=lambda item: (-len(item[1]), item[0]))
    ]


@dataclass(frozen=True)
class Deadlines:
    team: str
    action: str
    with_deadline: int
    breached: int  # expired, or decided after the deadline
    escalated: int


def deadlines(interrupts: QuerySet[Interrupt], days: int) -> list[Deadlines]:
    """Per team and action in the period: interrupts with a deadline, how many missed it, and
    how many were escalated."""
    since = timezone.now() - timedelta(days=days)
    late = Q(status=Interrupt.Status.EXPIRED) | Q(decided_at__gt=F("expires_at"))
    rows = (
        interrupts.filter(created_at__gte=since)
        .filter(Q(expires_at__isnull=False) | Q(escalated_at__isnull=False))
        .order_by()
        .values("team__name", "action")
        .annotate(
            with_deadline=Count("pk", filter=Q(expires_at__isnull=False)),
            breached=Count("pk", filter=Q(expires_at__isnull=False) & late),
            escalated=Count("pk", filter=Q(escalated_at__isnull=False)),
        )
        .order_by("team__name", "action")
    )
    return [
        Deadlines(row["team__name"], row["action"], row["with_deadline"], row["breached"], row["escalated"])
        for row in rows
    ]


def reviewer_chart(people: list[Reviewer]) -> list[dict[str, Any]]:
    """Geometry for a server-rendered SVG: per reviewer, decisions as a bar, rejected within."""
    most = max((person.decisions for person in people), default=0) or 1
    return [
        {
            "label": person.name,
            "y": 24 * i,
            "width": round(300 * person.decisions / most, 1),
            "rejected_width": round(300 * person.decisions * person.rejected / most, 1),
            "decisions": person.decisions,
            "median": human(person.median),
            "rejected": f"{person.rejected:.0%}",
        }
        for i, person in enumerate(people[:20])
    ]


# Exports. A cell a spreadsheet would run as a formula (OWASP "CSV injection") is prefixed with
# a quote, which spreadsheets show as text: messages, answers, reasons and names are all
# somebody's input. JSON Lines carries values as they are (no spreadsheet reads it).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")

INTERRUPT_COLUMNS = [
    "interrupt_id", "run_id", "seq", "team", "action", "consumer", "status", "message", "data",
    "answer", "reason", "requested_by", "decided_by", "decided_via", "edited_arguments",
    "comments", "created_at", "decided_at", "seconds_to_decision",
]  # fmt: skip
EVENT_COLUMNS = [
    "event_id", "seq", "run_id", "interrupt_id", "team", "kind", "actor", "at", "detail", "hash", "run_hash",
]  # fmt: skip


# Columns that hold a JSON value, written as JSON in a CSV cell whatever it is (an answer may
# be true, or a string): empty when there is none.
JSON_COLUMNS = frozenset({"data", "answer", "edited_arguments", "detail"})


def neutralise(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


class _Echo:
    def write(self, value: str) -> str:
        return value


def _json(value: Any) -> str:
    return "" if value is None else json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False)


def interrupt_record(it: Interrupt) -> dict[str, Any]:
    decided = it.decided_at
    return {
        "interrupt_id": it.pk,
        "run_id": it.run_id,
        "seq": it.seq,
        "team": it.team.slug,
        "action": it.action,
        "consumer": it.run.consumer,
        "status": it.status,
        "message": it.message,
        "data": it.data,
        "answer": it.answer,
        "reason": it.reason,
        "requested_by": it.run.started_by_name,
        "decided_by": it.decided_by_name,
        "decided_via": it.decided_via,
        "edited_arguments": it.edited_arguments,
        "comments": getattr(it, "comment_count", 0),
        "created_at": it.created_at.isoformat(),
        "decided_at": decided.isoformat() if decided else None,
        "seconds_to_decision": round((decided - it.created_at).total_seconds(), 3) if decided else None,
    }


def event_record(event: RunEvent, teams: dict[int, str]) -> dict[str, Any]:
    return {
        "event_id": event.pk,
        "seq": event.seq,
        "run_id": event.run_id,
        "interrupt_id": event.interrupt_id,
        "team": teams.get(event.run.team_id, ""),
        "kind": event.kind,
        "actor": event.actor_name,
        "at": event.at.isoformat(),
        "detail": event.detail,
        "hash": event.hash,
        "run_hash": event.run_hash,
    }


def lines(records: Iterator[dict[str, Any]], columns: list[str], fmt: str) -> Iterator[str]:
    if fmt == "jsonl":
        for record in records:
            yield json.dumps(record, cls=DjangoJSONEncoder, ensure_ascii=False) + "\n"
        return
    writer = csv.writer(_Echo())
    yield writer.writerow(columns)
    for record in records:
        yield writer.writerow(
            neutralise(_json(value) if column in JSON_COLUMNS else "" if value is None else value)
            for column, value in ((column, record[column]) for column in columns)
        )


def interrupt_records(interrupts: QuerySet[Interrupt]) -> Iterator[dict[str, Any]]:
    counted = interrupts.annotate(comment_count=Count("comments"))
    for it in counted.iterator(chunk_size=2000):
        yield interrupt_record(it)


def event_records(interrupts: QuerySet[Interrupt], scope: list[int] | None) -> Iterator[dict[str, Any]]:
    """The events of the interrupts' runs. A member's (``scope``: their teams) are those of the
    interrupts they may read and their own teams' runs' own events, without an error's text
    (kept for staff): not a pending question, nor what another team was asked."""
    teams = dict(Team.objects.values_list("pk", "slug"))
    runs = interrupts.order_by().values("run_id")
    events = RunEvent.objects.filter(run_id__in=runs)
    if scope is not None:
        events = events.filter(
            Q(interrupt_id__in=interrupts.order_by().values("pk"))
            | Q(interrupt__isnull=True, run__team__in=scope)
        )
    for event in events.select_related("run").order_by("run_id", "seq", "id").iterator(chunk_size=2000):
        record = event_record(event, teams)
        if scope is not None and event.kind == RunEvent.Kind.ERROR:
            record["detail"] = {}
        yield record
