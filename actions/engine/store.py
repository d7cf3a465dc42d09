"""The engine's statements: the reads and writes the engine makes of a run, an interrupt, the
event log and the audit chain are functions here, named for what they do (a new row is
inserted with actions.engine.sql.insert, its one generic statement).

The rule: a statement on the path of a pause and its decision (measured by
bench/engine_throughput.py), and a read an API request on that path makes (bench/api_latency.py),
is written in SQL, through actions.engine.sql's templates (a
conditional UPDATE with RETURNING, PostgreSQL and SQLite 3.35+), and its rows come back as
model instances through ``Model.from_db``; anything else is the ORM, inside a function here when
the engine calls it more than once. Through the ORM, each statement of that path cost several
times its execution in building the query, which made the engine slower than LangGraph at the
same work. No other module of the project writes SQL (tests/test_layout.py), in the spirit of
DBOS's system database (``_sys_db.py``): a reader who wants to know what the engine asks of the
database reads this file.
"""

from __future__ import annotations

import enum
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import BooleanField, F, Func, ManyToManyField, OneToOneField, Q, QuerySet, Value
from django.db.models.expressions import RawSQL
from django.utils import timezone

from actions.engine.sql import (
    Json,
    M,
    adapted,
    columns_of,
    default_db,
    execute,
    fetch,
    fetch_together,
    open_cursor,
    sql,
)
from actions.models import (
    GENESIS,
    ApiToken,
    Approval,
    Interrupt,
    Policy,
    Preferences,
    Run,
    RunEvent,
    Team,
    TeamChannels,
    Webhook,
    hash_token,
)

logger = logging.getLogger(__name__)


def insert_events(rows: Sequence[Sequence[Any]]) -> None:
    """Append events to run logs in one INSERT; each is (run_id, interrupt_id, kind, actor_id,
    actor_name, detail, at, seq, hash, run_hash): its place in the audit chain and its hashes
    given (actions.engine.audit.append makes them, in the transaction this runs in)."""
    if not rows:
        return
    row = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    execute(
        sql(
            "INSERT INTO {RunEvent} ({RunEvent.run}, {RunEvent.interrupt}, {RunEvent.kind},"
            " {RunEvent.actor}, {RunEvent.actor_name}, {RunEvent.detail}, {RunEvent.at},"
            " {RunEvent.seq}, {RunEvent.hash}, {RunEvent.run_hash}) VALUES "
        )
        + ", ".join([row] * len(rows)),
        [value for event in rows for value in event],
    )


def interrupts_matching(text: str, newest: int | None = None) -> Q | None:
    """A filter of the interrupts whose search document (message, data, answer, reason,
    comments, the run's input: kept by triggers, migration 0015) holds every word of ``text``;
    None when ``text`` has no word to look for.

    ``newest``: the caller reads only that many, newest first (a page of the history). On SQLite
    the filter is then one of three plans for that read, chosen by ``_plan``, so that a word
    every row holds costs as much in a long history as in a short one: the matches' ids, when
    they are few, as found in choosing (what an invoice number wants); the matches' ids, all of
    them, looked up and ordered by date (what a rarer word wants); or the history's date index
    walked from the newest row, FTS5 asked of each (what a common word wants: it finds a page's
    rows among the first it walks)."""
    if default_db().vendor == "postgresql":
        return Q(
            pk__in=RawSQL(
                "SELECT interrupt_id FROM actions_interrupt_search"
                " WHERE document @@ websearch_to_tsquery('simple', %s)",
                [text.replace("\x00", " ")],
            )
        )
    query = _fts_query(text)
    if query is None:
        return None
    if newest is None:
        return _looked_up(query)
    plan = _plan(query, newest)
    if plan.few is not None:
        return Q(pk__in=plan.few)
    if plan.budget:
        # The row's id as the ORM names it where the filter lands (a subquery's alias included).
        return Q(
            Func(
                Value(query),
                F("id"),
                template="EXISTS (SELECT 1 FROM actions_interrupt_search s"
                " WHERE s.actions_interrupt_search MATCH %(expressions)s)",
                arg_joiner=" AND s.rowid = ",
                output_field=BooleanField(),
            )
        )
    return _looked_up(query)


def _looked_up(query: str) -> Q:
    """The matches of an FTS5 query, all of them, looked up by id."""
    return Q(
        pk__in=RawSQL(
            "SELECT rowid FROM actions_interrupt_search WHERE actions_interrupt_search MATCH %s", [query]
        )
    )


def first_matching(lists: Sequence[QuerySet[Interrupt]], text: str, newest: int) -> list[int] | Q:
    """On SQLite, for a page of a search that reads only some of the history (a member's: their
    team's rows, and those escalated to it): the ids of the first ``newest`` of each of
    ``lists`` (querysets, each in the page's order) whose search document holds every word of
    ``text`` (none when it has no word), found by asking FTS5 of the lists' rows in turn. Or,
    when a walk does not pay, the filter of the matches to read the page from (as
    ``interrupts_matching`` plans it): when the matches are too few for a walk to pay, or when
    the walks asked of as many rows as looking the matches up costs, all lists together, and
    one had not found its page (a word common in the history and rare in the list): a walk
    costs at most about what it spares."""
    query = _fts_query(text)
    if query is None:
        return []
    plan = _plan(query, newest)
    if plan.few is not None:
        return Q(pk__in=plan.few)
    if not plan.budget:
        return _looked_up(query)
    budget = plan.budget
    found: list[int] = []
    with open_cursor(default_db()) as cursor:
        for rows in lists:
            # One more than may be asked of: whether the list goes on past them.
            walked = list(rows.values_list("pk", flat=True)[: budget + 1])
            more, walked = len(walked) > budget, walked[:budget]
            held: list[int] = []
            # A page's length at a time: a word most rows hold finds its page in one.
            for start in range(0, len(walked), newest):
                chunk = walked[start : start + newest]
                budget -= len(chunk)
                cursor.execute(
                    "SELECT rowid FROM actions_interrupt_search WHERE actions_interrupt_search MATCH %s"
                    f" AND rowid IN ({_marks(chunk)})",
                    [query, *chunk],
                )
                matched = {row[0] for row in cursor.fetchall()}
                held += [pk for pk in chunk if pk in matched]
                if len(held) >= newest:
                    break
            else:
                if more:
                    return _looked_up(query)  # the walk ended before its page and its list
            found += held[:newest]
    return found


def _fts_query(text: str) -> str | None:
    """``text`` as an FTS5 query of its words, each once and each a phrase (quoted: FTS5's own
    syntax, AND, NEAR, column:, is not the user's); None when it has no word to look for."""
    words: dict[str, str] = {}
    for word in text.replace("\x00", " ").split():
        if any(ch.isalnum() for ch in word):
            words.setdefault(word.lower(), word)  # FTS5's tokenizer folds case (not "ß" to "ss")
    if not words:
        return None
    return " ".join('"' + word.replace('"', '""') + '"' for word in words.values())


# A search of more words than this (as FTS5 splits them: runs of letters and digits) is looked
# up, never walked: a walk asks FTS5 the whole query once for each chunk of rows, and a query of
# thousands of words would make that costly.
_WALKED_WORDS = 16
_TOKEN = re.compile(r"[^\W_]+")


# What SQLite's walk and lookup cost (measured at 100,000 interrupts, bench/inbox_scale.py):
# FTS5 hands over a match's id in about 0.3 us, and all of them are read to be ordered by date;
# asking it whether one row matches costs about 40 us, and a walk asks of about
# ``newest * rows / matches`` rows before it has its page. Counting matches costs about 0.06 us
# each, so the count stops where the walk starts to pay.
_ID_US, _ASK_US = 0.3, 40.0


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a page of a search is best read on SQLite: ``few``, the matches' ids, all of them,
    when they are few; otherwise ``budget``, the rows a walk may ask FTS5 of (0: look the
    matches up)."""

    few: list[int] | None = None
    budget: int = 0


# Matches handed over as ids when they are fewer: found in deciding, not searched for again.
_FEW = 500


def _plan(query: str, newest: int) -> _Plan:
    """How a page (``newest`` rows) of the search for ``query`` is best read. Its first matches
    are read, as many as ``_FEW``: fewer, they are all of them (an invoice number's), and the
    page is read by their ids. Otherwise a walk of the history's index, asking FTS5 of each
    row, pays when the matches are so many that it meets ``newest`` of them early: decided by
    counting them (again from the first), no further than where the walk starts to pay; its
    budget is the rows it may ask of before it costs what looking every match up costs at
    least."""
    with open_cursor(default_db()) as cursor:
        cursor.execute(
            "SELECT rowid FROM actions_interrupt_search WHERE actions_interrupt_search MATCH %s LIMIT %s",
            [query, _FEW],
        )
        first = [row[0] for row in cursor.fetchall()]
        if len(first) < _FEW:
            return _Plan(few=first)
        if len(_TOKEN.findall(query)) > _WALKED_WORDS:
            return _Plan()
        # About how many rows the walk passes over (the highest id: no count of them all).
        cursor.execute(sql("SELECT max({Interrupt.id}) FROM {Interrupt}"), [])
        rows = cursor.fetchone()[0] or 0
        # The walk pays when matches**2 > newest * rows * ASK / ID: count no further.
        enough = math.isqrt(int(newest * rows * _ASK_US / _ID_US)) + 1
        cursor.execute(
            "SELECT count(*) FROM (SELECT 1 FROM actions_interrupt_search"
            " WHERE actions_interrupt_search MATCH %s LIMIT %s)",
            [query, enough],
        )
        if cursor.fetchone()[0] < enough:
            return _Plan()
        return _Plan(budget=max(newest, int(enough * _ID_US / _ASK_US)))


def refresh_statistics() -> bool:
    """On SQLite, the query planner's statistics of the interrupts (a sampled ANALYZE, a few
    milliseconds at 100,000) made again when there were none, or once the interrupts have
    doubled or halved (retention) since they were made; whether they were. Without them SQLite
    reads a member's history page, or a search for a word no row holds, by the team's index,
    all of it (12 to 25 ms at 100,000 interrupts, 2 ms with them). PostgreSQL's autovacuum
    keeps its own. Run by the periodic round, after its other work: it never raises (the
    database locked a while, say: it is said in the log, and tried again next round)."""
    connection = default_db()
    if connection.vendor != "sqlite":
        return False
    try:
        return _refresh_statistics(connection)
    except Exception:
        logger.warning("could not refresh the database's planner statistics", exc_info=True)
        return False


def _refresh_statistics(connection: Any) -> bool:
    with open_cursor(connection) as cursor:
        cursor.execute(sql("SELECT count(*) FROM {Interrupt}"), [])
        rows = cursor.fetchone()[0]
        cursor.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'", [])
        analyzed = None
        if cursor.fetchone() is not None:
            cursor.execute(
                "SELECT stat FROM sqlite_stat1 WHERE tbl = %s AND idx = 'interrupt_created_id'",
                [Interrupt._meta.db_table],
            )
            stat = cursor.fetchone()
            analyzed = int(stat[0].split()[0]) if stat else 0  # none: the table was empty
        # A sample's count is off by up to half: within a factor of two is "the same".
        if analyzed is not None and analyzed / 2 <= rows <= max(analyzed, 500) * 2:
            return False
        try:
            with transaction.atomic():
                cursor.execute("PRAGMA analysis_limit = 1000", [])
                # The interrupts' table alone: with statistics of the teams' (a handful of
                # rows), SQLite starts a history page's join from the teams, and sorts every
                # interrupt.
                cursor.execute(sql("ANALYZE {Interrupt}"), [])
        finally:
            cursor.execute("PRAGMA analysis_limit = 0", [])  # as a new connection has it
    return True


@cache
def _chain_query(runs: int, vendor: str) -> str:
    newest = sql(
        "(SELECT e.{RunEvent.run_hash} FROM {RunEvent} e WHERE e.{RunEvent.run} = %s"
        " AND e.{RunEvent.seq} IS NOT NULL ORDER BY e.{RunEvent.seq} DESC LIMIT 1)"
    )
    lock = " FOR UPDATE" if default_db().features.has_select_for_update else ""
    return (
        sql("SELECT {AuditChain.seq}, {AuditChain.head}")
        + "".join(f", {newest}" for _ in range(runs))
        + sql(" FROM {AuditChain} WHERE {AuditChain.id} = 1")
        + lock
    )


# The directory's lock on PostgreSQL (pg_advisory_xact_lock's key): "grundlag".
_DIRECTORY_LOCK = 0x6772756E646C6167


def lock_directory() -> None:
    """Hold the company directory's resources (SCIM) until this transaction ends. On SQLite the
    transaction's write lock, taken as it begins (BEGIN IMMEDIATE), holds everything already."""
    connection = default_db()
    if connection.vendor == "postgresql":
        with open_cursor(connection) as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_DIRECTORY_LOCK])


def lock_audit_chain(run_ids: Sequence[int]) -> tuple[int, str, dict[int, str]]:
    """The audit chain's place and head, its row locked until the transaction ends (SQLite's
    IMMEDIATE transaction holds the whole database already), and each run's newest run_hash
    (a run with no event yet is absent): one statement. The head moves on with each event
    inserted (a trigger, migration 0015)."""
    query = _chain_query(len(run_ids), default_db().vendor)
    with open_cursor(default_db()) as cursor:
        cursor.execute(query, list(run_ids))
        row = cursor.fetchone()
        if row is None:  # a database emptied by hand (a test's flush): the chain starts again
            cursor.execute(
                sql(
                    "INSERT INTO {AuditChain} ({AuditChain.id}, {AuditChain.seq}, {AuditChain.head})"
                    " VALUES (1, 0, %s)"
                ),
                [GENESIS],
            )
            cursor.execute(query, list(run_ids))
            row = cursor.fetchone()
    heads = {int(run_id): str(value) for run_id, value in zip(run_ids, row[2:], strict=True) if value}
    return int(row[0]), str(row[1]), heads


# What a step needs of its run, and what recording its pauses reads of it (who asked, for the
# team's rules and grants): it reads nothing else of it. A column left out is read when first
# used, by a query of its own.
_STEP_COLUMNS = (
    "{Run.id}, {Run.action}, {Run.input}, {Run.team}, {Run.consumer}, {Run.status}, {Run.attempt},"
    " {Run.driver_state}, {Run.started_by}, {Run.started_by_token}, {Run.started_by_name}"
)


@dataclass(frozen=True, slots=True)
class Shares:
    """How many steps may run at once (0: no limit): of one team, of one API token's runs, and
    of one team's scripts (GRUNDLAG_TEAM_STEPS, GRUNDLAG_TOKEN_STEPS, GRUNDLAG_TEAM_SCRIPTS)."""

    team: int = 0
    token: int = 0
    scripts: int = 0


# Running steps of the run's team (of its token, of its team's scripts), counted in the claim
# from the partial index run_running_team (the status written out: SQLite uses a partial index
# only for the condition it was made with, not for a parameter).
_IN_FLIGHT = (
    "(SELECT COUNT(*) FROM {Run} AS other"
    " WHERE other.{Run.status} = 'running' AND other.{Run.team} = {Run}.{Run.team}{also})"
)
_TEAM_IN_FLIGHT = _IN_FLIGHT.replace("{also}", "")
_TOKEN_IN_FLIGHT = _IN_FLIGHT.replace(
    "{also}", " AND other.{Run.started_by_token} = {Run}.{Run.started_by_token}"
)
_SCRIPTS_IN_FLIGHT = _IN_FLIGHT.replace("{also}", " AND other.{Run.consumer} = %s")


def _within(shares: Shares) -> tuple[str, list[Any]]:
    """The conditions (and their parameters) a queued run of {Run} meets while its team, its
    token and its team's scripts are within their shares: "" when there are no limits."""
    limits: list[str] = []
    params: list[Any] = []
    if shares.team:
        limits.append(f" AND {_TEAM_IN_FLIGHT} < %s")
        params += [shares.team]
    if shares.token:
        limits.append(f" AND ({{Run.started_by_token}} IS NULL OR {_TOKEN_IN_FLIGHT} < %s)")
        params += [shares.token]
    if shares.scripts:
        limits.append(f" AND ({{Run.consumer}} <> %s OR {_SCRIPTS_IN_FLIGHT} < %s)")
        params += [Run.Consumer.SANDBOX, Run.Consumer.SANDBOX, shares.scripts]
    return "".join(limits), params


def claim_queued(
    run_id: int, now: datetime, lease_expires_at: datetime, shares: Shares = Shares()
) -> Run | None:
    """Move a queued run to running, under a new lease: of two deliveries of the same message
    (at-least-once), or two workers, exactly one gets the run; the other gets None. So does a
    worker when the run's team (its token, its team's scripts) already has its share of steps
    running: the run stays queued, for ``next_in_line`` to hand on when one of them ends.

    The share is counted in the claim's own statement. On PostgreSQL, two claims of one team
    could each count before the other's commit and both take the last place: an advisory lock
    on the team, taken first and held to the commit, makes them count one after the other
    (SQLite's write lock does the same for every claim)."""
    limits, more = _within(shares)
    params = [Run.Status.RUNNING, lease_expires_at, now, run_id, Run.Status.QUEUED, *more]
    if limits and default_db().vendor == "postgresql":
        execute(
            sql(
                "SELECT pg_advisory_xact_lock(%s, CAST({Run.team} AS integer)) FROM {Run} WHERE {Run.id} = %s"
            ),
            [_CLAIM_LOCKS, run_id],
        )
    claimed = fetch(
        Run,
        sql(
            "UPDATE {Run} SET {Run.status} = %s, {Run.attempt} = {Run.attempt} + 1,"
            " {Run.lease_expires_at} = %s, {Run.updated_at} = %s"
            " WHERE {Run.id} = %s AND {Run.status} = %s" + limits + f" RETURNING {_STEP_COLUMNS}"
        ),
        params,
    )
    return claimed[0] if claimed else None


# The advisory locks' first key: the claims' (a team's id is the second).
_CLAIM_LOCKS = 0x6772


def next_in_line(team_id: int, count: int, shares: Shares) -> list[int]:
    """The team's ``count`` longest-waiting queued runs that its shares let run now (a waiting
    script is passed over while the team's scripts are at theirs, and so is a token's run), for
    a worker to hand on when one of the team's steps ended."""
    limits, params = _within(shares)
    return _ids(
        "SELECT {Run.id} FROM {Run} WHERE {Run.status} = %s AND {Run.team} = %s"
        + limits
        + " ORDER BY {Run.updated_at}, {Run.id} LIMIT %s",
        [Run.Status.QUEUED, team_id, *params, count],
    )


def unclaimed(before: datetime, shares: Shares) -> list[int]:
    """Queued runs whose message was sent before ``before`` and that their shares let run now,
    for the sweeper to send again: a run waiting its turn is not sent only to be refused."""
    limits, params = _within(shares)
    return _ids(
        "SELECT {Run.id} FROM {Run} WHERE {Run.status} = %s AND {Run.updated_at} <= %s" + limits,
        [Run.Status.QUEUED, before, *params],
    )


def _ids(template: str, params: Sequence[Any]) -> list[int]:
    connection = default_db()
    with open_cursor(connection) as cursor:
        cursor.execute(sql(template), adapted(connection, params))
        return [row[0] for row in cursor.fetchall()]


class Keep(enum.Enum):
    """record_step's driver_state when the run keeps the one it has."""

    KEEP = "keep"


KEEP = Keep.KEEP


def record_step(
    run: Run,
    now: datetime,
    *,
    status: str,
    driver_state: dict[str, Any] | Keep,
    output: Any,
    error: str,
    finished_at: datetime | None,
) -> bool:
    """Record how a step ended, if ``run.attempt`` still holds the lease: a step whose run the
    sweeper re-queued (its worker presumed dead) and another worker claimed records nothing.
    A running step has no output, error or end yet, so each is set to what this step gave."""
    keep = driver_state is KEEP
    return bool(
        execute(
            sql(
                "UPDATE {Run} SET {Run.status} = %s, {Run.updated_at} = %s,"
                " {Run.lease_expires_at} = NULL,"
                + (" {Run.driver_state} = {Run.driver_state}," if keep else " {Run.driver_state} = %s,")
                + " {Run.output} = %s, {Run.error} = %s, {Run.finished_at} = %s"
                " WHERE {Run.id} = %s AND {Run.status} = %s AND {Run.attempt} = %s"
            ),
            [
                status,
                now,
                *([] if keep else [Json(driver_state)]),
                Json(output),
                error,
                finished_at,
                run.pk,
                Run.Status.RUNNING,
                run.attempt,
            ],
        )
    )


def lock_run(run_id: int) -> Run:
    """The run (what a decision needs of it), locked until the transaction ends: the first lock
    of every change (the run, then its interrupts), so two changes of one run queue. On SQLite
    the IMMEDIATE transaction holds the database's write lock already, so nothing is read
    until a field is used."""
    if not default_db().features.has_select_for_update:
        return Run.from_db(DEFAULT_DB_ALIAS, ["id"], [run_id])
    (run,) = fetch(
        Run,
        sql(
            "SELECT {Run.id}, {Run.team}, {Run.consumer}, {Run.status} FROM {Run}"
            " WHERE {Run.id} = %s FOR UPDATE"
        ),
        [run_id],
    )
    return run


def counted_approvals(interrupt: Interrupt) -> list[Approval]:
    """The approvals of an N-of-M that count now: all for the same answer, oldest first."""
    return list(interrupt.approvals.filter(superseded_at=None).select_related("user").order_by("at", "id"))


def next_seq(run_id: int) -> tuple[str, str, list[Any]]:
    """An interrupt's number in its run, for insert(): one more than the run's last, counted as
    it is inserted."""
    return (
        "seq",
        sql("(SELECT COALESCE(MAX({Interrupt.seq}), 0) + 1 FROM {Interrupt} WHERE {Interrupt.run} = %s)"),
        [run_id],
    )


def decide(
    interrupt_id: int,
    now: datetime,
    *,
    status: str,
    answer: Any,
    reason: str,
    decided_by_id: int | None,
    decided_by_name: str,
    decided_via: str = "",
    edited_arguments: Any = None,
) -> bool:
    """Decide a pending interrupt. Of two reviewers clicking at once, exactly one changes the
    pending row; the other changes nothing (False)."""
    return bool(
        execute(
            sql(
                "UPDATE {Interrupt} SET {Interrupt.status} = %s, {Interrupt.answer} = %s,"
                " {Interrupt.edited_arguments} = %s,"
                " {Interrupt.reason} = %s, {Interrupt.decided_by} = %s, {Interrupt.decided_by_name} = %s,"
                " {Interrupt.decided_via} = %s, {Interrupt.decided_at} = %s"
                " WHERE {Interrupt.id} = %s AND {Interrupt.status} = %s"
            ),
            [
                status,
                Json(answer),
                Json(edited_arguments),
                reason,
                decided_by_id,
                decided_by_name,
                decided_via,
                now,
                interrupt_id,
                Interrupt.Status.PENDING,
            ],
        )
    )


def resume_if_nothing_pending(run_id: int, now: datetime, lease_expires_at: datetime | None) -> Run | None:
    """Move an interrupted run on once none of its interrupts is pending (an agent's turn may
    pause on several calls, each decided apart): queued for a worker, or, given a lease, claimed
    already by the caller for an inline step. Returns the run as a step needs it, or None."""
    claim = lease_expires_at is not None
    resumed = fetch(
        Run,
        sql(
            "UPDATE {Run} SET {Run.status} = %s, {Run.updated_at} = %s,"
            " {Run.attempt} = {Run.attempt} + %s, {Run.lease_expires_at} = %s"
            " WHERE {Run.id} = %s AND {Run.status} = %s AND NOT EXISTS"
            " (SELECT 1 FROM {Interrupt} WHERE {Interrupt.run} = %s AND {Interrupt.status} = %s)"
            f" RETURNING {_STEP_COLUMNS}"
        ),
        [
            Run.Status.RUNNING if claim else Run.Status.QUEUED,
            now,
            1 if claim else 0,
            lease_expires_at,
            run_id,
            Run.Status.INTERRUPTED,
            run_id,
            Interrupt.Status.PENDING,
        ],
    )
    return resumed[0] if resumed else None


# Reads every cycle makes. Through the ORM these three cost a third of a pause-and-resume
# cycle (bench/engine_throughput.py: 319 against 213 cycles per second).


def _by_id(model: type[M], pk: int) -> M | None:
    """The row of ``model`` with that primary key, every column; None when there is none."""
    name = model.__name__
    found = fetch(model, sql(f"SELECT * FROM {{{name}}} WHERE {{{name}.pk}} = %s"), [pk])
    return found[0] if found else None


def interrupt(interrupt_id: int) -> Interrupt:
    found = _by_id(Interrupt, interrupt_id)
    if found is None:  # a row the caller's transaction holds
        raise ValueError(f"interrupt {interrupt_id} is gone")
    return found


# An id the database cannot hold names no row (SQLite's driver refuses the number itself).
_MAX_ID = 2**63 - 1


def read_run(run_id: int) -> Run | None:
    """The run; None when there is none. What `Prefer: wait` reads each time it looks again."""
    return team_run(run_id, None)


def team_run(run_id: int, team_id: int | None, consumer: str | None = None) -> Run | None:
    """The run, if it is team ``team_id``'s (None: any team's, for what acts for the engine
    itself) and, where given, by driver ``consumer``; None otherwise. What an API request
    names a run by."""
    if not 0 < run_id <= _MAX_ID:
        return None
    where = ["{Run.id} = %s"]
    params: list[Any] = [run_id]
    if team_id is not None:
        where.append("{Run.team} = %s")
        params.append(team_id)
    if consumer:
        where.append("{Run.consumer} = %s")
        params.append(consumer)
    found = fetch(Run, sql("SELECT * FROM {Run} WHERE " + " AND ".join(where)), params)
    return found[0] if found else None


def read_team(team_id: int) -> Team:
    """A team that a row names (its foreign key holds it). Raises Team.DoesNotExist should
    it have been deleted since the row was read."""
    team = _by_id(Team, team_id)
    if team is None:
        raise Team.DoesNotExist(f"team {team_id}")
    return team


def read_interrupt(interrupt_id: int) -> Interrupt | None:
    """The interrupt, with its team and its run (what a notification tells of it, and an
    inbox row shows), in one statement; None when it is gone."""
    statement = _interrupt_with_run_and_team(default_db().vendor)
    found = fetch_together((Interrupt, Run, Team), statement, [interrupt_id])
    if not found:
        return None
    it: Interrupt
    it, run, team = found[0]
    it.run, it.team = run, team
    return it


@cache
def _interrupt_with_run_and_team(vendor: str) -> str:
    return sql(
        f"SELECT {columns_of(Interrupt, 'i')}, {columns_of(Run, 'r')}, {columns_of(Team, 't')} "
        "FROM {Interrupt} i JOIN {Run} r ON r.{Run.id} = i.{Interrupt.run} "
        "JOIN {Team} t ON t.{Team.id} = i.{Interrupt.team} WHERE i.{Interrupt.id} = %s"
    )


def read_run_of_team(run_id: int) -> Run | None:
    """The run, with its team, in one statement; None when there is none."""
    if not 0 < run_id <= _MAX_ID:
        return None
    found = fetch_together((Run, Team), _run_with_team(default_db().vendor), [run_id])
    if not found:
        return None
    run: Run
    run, team = found[0]
    run.team = team
    return run


@cache
def _run_with_team(vendor: str) -> str:
    return sql(
        f"SELECT {columns_of(Run, 'r')}, {columns_of(Team, 't')} "
        "FROM {Run} r JOIN {Team} t ON t.{Team.id} = r.{Run.team} WHERE r.{Run.id} = %s"
    )


def people(
    team_ids: Sequence[int],
    roles: Collection[str],
    *,
    usernames: Sequence[str] | None = None,
    user_id: int | None = None,
) -> list[Any]:
    """The active members of these teams in one of ``roles``, each once, by id: of those, the
    ones ``usernames`` names (when given: none when it names none), or the one ``user_id`` (when
    given). Each with
    their notification preferences, as ``select_related`` reads them (none cached when they
    chose none): whom an interrupt's event is told to (actions.notify), on every pause's path."""
    if not team_ids or not roles or usernames is not None and not usernames:
        return []
    to_user, to_team = _membership()
    who = (
        sql(
            " FROM {User} u WHERE u.{User.is_active} AND EXISTS (SELECT 1 FROM {TeamMember} m"
            f" WHERE m.{{TeamMember.{to_user}}} = u.{{User.pk}} AND m.{{TeamMember.{to_team}}} IN ("
        )
        + _marks(team_ids)
        + sql(") AND m.{TeamMember.role} IN (")
        + _marks(sorted(roles))
        + "))"
    )
    params: list[Any] = [*team_ids, *sorted(roles)]
    if usernames:
        who += sql(" AND u.{User.username} IN (") + _marks(usernames) + ")"
        params += [str(name) for name in usernames]  # as the ORM's username__in would
    if user_id is not None:
        who += sql(" AND u.{User.pk} = %s")
        params.append(user_id)
    users = fetch(get_user_model(), "SELECT *" + who + sql(" ORDER BY u.{User.pk}"), params)
    if not users:
        return users
    # The same people's preferences, by the same condition: a big team's ids are not sent back
    # as parameters (SQLite takes a bounded number of them).
    chosen = {
        prefs.pk: prefs
        for prefs in fetch(
            Preferences,
            sql("SELECT * FROM {Preferences} WHERE {Preferences.user} IN (SELECT u.{User.pk}") + who + ")",
            params,
        )
    }
    of_user = Preferences._meta.get_field("user")
    assert isinstance(of_user, OneToOneField)
    for user in users:
        prefs = chosen.get(user.pk)
        of_user.remote_field.set_cached_value(user, prefs)  # user.grundlag_preferences
        if prefs is not None:
            of_user.set_cached_value(prefs, user)
    return users


@cache
def _membership() -> tuple[str, str]:
    """The fields of a team's membership row (Team.members' table) naming the user and the
    team: named after the site's user model."""
    members = Team._meta.get_field("members")
    assert isinstance(members, ManyToManyField)
    return members.m2m_reverse_field_name(), members.m2m_field_name()


def _marks(values: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def events_to_tell(
    kinds: Sequence[str], since: datetime, runs: Collection[int] | None, after_id: int, limit: int
) -> list[RunEvent]:
    """The events of these kinds logged since ``since`` whose notifications are not made yet
    (no Fanout row), oldest first, at most ``limit``: of the runs ``runs`` names (None: any),
    after the event ``after_id``. Read in part (what telling them needs), as the notifications'
    dispatcher reads them on every commit's path (actions.notify)."""
    if not kinds or runs is not None and not runs:
        return []
    statement = (
        sql(
            "SELECT e.{RunEvent.id}, e.{RunEvent.run}, e.{RunEvent.interrupt}, e.{RunEvent.kind},"
            " e.{RunEvent.detail}, e.{RunEvent.at}, e.{RunEvent.actor_name}"
            " FROM {RunEvent} e WHERE e.{RunEvent.at} >= %s"
            " AND NOT EXISTS (SELECT 1 FROM {Fanout} f WHERE f.{Fanout.event} = e.{RunEvent.id})"
            " AND e.{RunEvent.kind} IN ("
        )
        + _marks(kinds)
        + ")"
    )
    params: list[Any] = [since, *kinds]
    if runs is not None:
        ordered = sorted(runs)
        statement += sql(" AND e.{RunEvent.run} IN (") + _marks(ordered) + ")"
        params += ordered
    if after_id:
        statement += sql(" AND e.{RunEvent.id} > %s")
        params.append(after_id)
    return fetch(RunEvent, statement + sql(" ORDER BY e.{RunEvent.id} LIMIT %s"), [*params, limit])


def webhooks_of(team_ids: Sequence[int]) -> list[Webhook]:
    """The teams' webhooks not disabled, by id: whom an event is told to (actions.notify)."""
    if not team_ids:
        return []
    statement = sql("SELECT * FROM {Webhook} WHERE {Webhook.disabled_at} IS NULL AND {Webhook.team} IN (")
    return fetch(Webhook, statement + _marks(team_ids) + sql(") ORDER BY {Webhook.id}"), list(team_ids))


def team_channels(team_id: int) -> TeamChannels | None:
    """The team's choice of which events reach its people, and where (its row's key is the
    team's); None when it made none."""
    return _by_id(TeamChannels, team_id)


def fanned_out(event_id: int) -> bool:
    """Write the event's Fanout row (its notifications are made: actions.notify); False when
    another dispatcher wrote it first."""
    statement = sql(
        "INSERT INTO {Fanout} ({Fanout.event}, {Fanout.at}) VALUES (%s, %s)"
        " ON CONFLICT ({Fanout.event}) DO NOTHING"
    )
    return execute(statement, [event_id, timezone.now()]) == 1


def token_in_force(key_hash: str) -> ApiToken | None:
    """The API token of that hash, neither revoked nor expired, with its team
    (``authenticate``'s read)."""
    found = fetch(
        ApiToken,
        sql(
            "SELECT * FROM {ApiToken} WHERE {ApiToken.key_hash} = %s AND {ApiToken.revoked_at} IS NULL"
            " AND ({ApiToken.expires_at} IS NULL OR {ApiToken.expires_at} > %s)"
        ),
        [key_hash, timezone.now()],
    )
    if not found:
        return None
    (token,) = found
    token.team = read_team(token.team_id)
    return token


def authenticate(key: str | None) -> ApiToken | None:
    """The API token in force that ``key`` is (every API request, MCP call and idempotent POST
    asks first), its use noted."""
    try:
        token = token_in_force(hash_token(key)) if key else None
    except Team.DoesNotExist:
        return None  # its team deleted meanwhile, and the token with it
    if token is not None:
        token.note_use()
    return token


def visible_interrupt(interrupt_id: int, team_id: int) -> Interrupt | None:
    """The interrupt, if team ``team_id`` sees it (Interrupt.visible_to: its own, or escalated
    to it); None otherwise."""
    if not 0 < interrupt_id <= _MAX_ID:
        return None
    found = fetch(
        Interrupt,
        sql(
            "SELECT * FROM {Interrupt} WHERE {Interrupt.id} = %s AND ({Interrupt.team} = %s"
            " OR ({Interrupt.escalate_to} = %s AND {Interrupt.escalated_at} IS NOT NULL))"
        ),
        [interrupt_id, team_id, team_id],
    )
    return found[0] if found else None


# What the API tells of an interrupt and of its decision contract (responses.interrupt_out):
# never its checkpoint, nor the JSON columns it does not tell, which cost more than the rest.
_TOLD = (
    "{Interrupt.id}, {Interrupt.run}, {Interrupt.seq}, {Interrupt.team}, {Interrupt.status},"
    " {Interrupt.message}, {Interrupt.data}, {Interrupt.tool_call_id},"
    " {Interrupt.approvals_required}, {Interrupt.assignees}, {Interrupt.requester_may_approve},"
    " {Interrupt.expires_at}, {Interrupt.default_answer}, {Interrupt.escalate_to},"
    " {Interrupt.escalate_at}, {Interrupt.escalated_at}"
)


def waiting_on(run_id: int) -> Interrupt | None:
    """The pending interrupt the run waits on (the first), with what the API tells of it."""
    found = fetch(
        Interrupt,
        sql(
            f"SELECT {_TOLD} FROM {{Interrupt}} WHERE {{Interrupt.run}} = %s"
            " AND {Interrupt.status} = %s ORDER BY {Interrupt.seq} LIMIT 1"
        ),
        [run_id, Interrupt.Status.PENDING],
    )
    return found[0] if found else None


def pending_interrupts(run_id: int) -> list[Interrupt]:
    return fetch(
        Interrupt,
        sql(
            "SELECT * FROM {Interrupt} WHERE {Interrupt.run} = %s AND {Interrupt.status} = %s"
            " ORDER BY {Interrupt.seq}"
        ),
        [run_id, Interrupt.Status.PENDING],
    )


def policy_override(team_id: int, action_name: str) -> Policy | None:
    """The team's policy for the action, if it has one (unique per team and action)."""
    found = fetch(
        Policy,
        sql("SELECT * FROM {Policy} WHERE {Policy.team} = %s AND {Policy.action} = %s"),
        [team_id, action_name],
    )
    return found[0] if found else None


def team_policy(team_id: int, action_name: str) -> tuple[Policy | None, int, str]:
    """What a new interrupt of the action needs of its team, in one statement (a second only
    when the team overrides the action's policy): that policy, the version of the team's rules
    and its slug (actions.engine.rules)."""
    connection = default_db()
    with open_cursor(connection) as cursor:
        cursor.execute(
            sql(
                "SELECT {Team.rules_version}, {Team.slug}, {Policy}.{Policy.id} FROM {Team}"
                " LEFT JOIN {Policy} ON {Policy.team} = {Team}.{Team.id} AND {Policy.action} = %s"
                " WHERE {Team}.{Team.id} = %s"
            ),
            [action_name, team_id],
        )
        version, slug, policy_id = cursor.fetchone()
    return (policy_override(team_id, action_name) if policy_id is not None else None), version, slug


def run_interrupts(run_id: int) -> list[Interrupt]:
    """The run's interrupts, in order: its transcript (never the checkpoint, which a
    description of the run does not tell)."""
    return fetch(
        Interrupt,
        sql(
            f"SELECT {_TOLD}, {{Interrupt.action}}, {{Interrupt.binding}}, {{Interrupt.answer}},"
            " {Interrupt.edited_arguments}, {Interrupt.reason}, {Interrupt.decided_by_name},"
            " {Interrupt.decided_at}, {Interrupt.created_at}"
            " FROM {Interrupt} WHERE {Interrupt.run} = %s ORDER BY {Interrupt.seq}"
        ),
        [run_id],
    )


def decided_interrupts(run_id: int) -> list[Interrupt]:
    """The run's approved and rejected interrupts, oldest first, with what a step resumes from."""
    return fetch(
        Interrupt,
        sql(
            "SELECT {Interrupt.id}, {Interrupt.status}, {Interrupt.answer}, {Interrupt.state},"
            " {Interrupt.binding}, {Interrupt.reason}, {Interrupt.decided_by_name},"
            " {Interrupt.edited_arguments} FROM {Interrupt}"
            " WHERE {Interrupt.run} = %s AND {Interrupt.status} IN (%s, %s) ORDER BY {Interrupt.seq}"
        ),
        [run_id, Interrupt.Status.APPROVED, Interrupt.Status.REJECTED],
    )


# Per database (host, port, name): whether it has the journal's function, and when that was
# last asked. Found, it stays; missing (processes started before `migrate`), asked again after
# a minute, the three statements doing the work meanwhile.
_journal_function: dict[tuple[str, str, str], tuple[bool, float]] = {}
JOURNAL_FUNCTION_RECHECK_SECONDS = 60.0


def journal_in_one_call() -> bool:
    """Whether the database writes a transaction's journal (its events, chained, and its inbox
    streams) in one call of its own (PostgreSQL, migration 0021: a round trip instead of three)."""
    connection = default_db()
    if connection.vendor != "postgresql":
        return False
    where = connection.settings_dict
    key = (str(where.get("HOST", "")), str(where.get("PORT", "")), str(where.get("NAME", "")))
    known = _journal_function.get(key)
    if known is not None and (known[0] or time.monotonic() - known[1] < JOURNAL_FUNCTION_RECHECK_SECONDS):
        return known[0]
    with open_cursor(connection) as cursor:
        cursor.execute(
            "SELECT to_regprocedure(%s) IS NOT NULL", ["grundlag_append_journal(jsonb,bigint[],bigint[])"]
        )
        found = bool(cursor.fetchone()[0])
    if not found:
        logger.warning(
            "PostgreSQL has no grundlag_append_journal (migration 0021): run `manage.py migrate`;"
            " until then each transaction's journal takes three statements"
        )
    _journal_function[key] = (found, time.monotonic())
    return found


def append_journal(
    events: Sequence[Sequence[Any]],
    counts: dict[int, int],
    numbered: Callable[[dict[int, int]], None] | None = None,
    *,
    last: bool = False,
) -> None:
    """PostgreSQL: chain and insert the events, each (run_id, interrupt_id, kind, actor_id,
    actor_name, detail, at, content after its place: actions.engine.audit.rest), and move each
    team's inbox stream on by its count; ``numbered`` is given each team's new last number. One
    statement: the server's ``grundlag_append_journal`` takes the chain's head (locked until the
    commit) and computes the hashes audit.chained would. With ``last`` (the transaction writes
    nothing after it) it is sent with the transaction's COMMIT where the backend can
    (grundlag_site.db.postgresql: one round trip instead of two), and ``numbered`` is called
    once it has committed, before the transaction's ``on_commit`` callbacks."""
    teams = sorted(counts)
    connection = default_db()
    query = "SELECT o_team, o_seq FROM grundlag_append_journal(%s::jsonb, %s::bigint[], %s::bigint[])"
    params = adapted(
        connection,
        [
            Json([[*event[:6], event[6].isoformat(), event[7]] for event in events]),
            teams,
            [counts[team] for team in teams],
        ],
    )

    def given(rows: list[Any]) -> None:
        if numbered is not None:
            numbered({int(team): int(seq) for team, seq in rows})

    hold = getattr(connection, "hold_for_commit", None)
    if last and hold is not None and hold(query, params, given):
        return
    with open_cursor(connection) as cursor:
        cursor.execute(query, params)
        given(cursor.fetchall())


def advance_streams(counts: dict[int, int]) -> dict[int, int]:
    """Move each team's inbox stream on by its count of changes; each team's new last number.
    In the transaction of the changes, as its last statement: the row stays locked only until
    the commit, and the numbers are in the order the changes commit. Teams in id order, so two
    transactions never wait for each other's."""
    teams = sorted(counts)
    if not teams:
        return {}
    connection = default_db()
    with open_cursor(connection) as cursor:
        cursor.execute(
            sql("INSERT INTO {InboxStream} ({InboxStream.team}, {InboxStream.seq}) VALUES ")
            + ", ".join(["(%s, %s)"] * len(teams))
            + sql(
                " ON CONFLICT ({InboxStream.team}) DO UPDATE SET {InboxStream.seq} ="
                " {InboxStream}.{InboxStream.seq} + excluded.{InboxStream.seq}"
                " RETURNING {InboxStream.team}, {InboxStream.seq}"
            ),
            [value for team in teams for value in (team, counts[team])],
        )
        return {int(team): int(seq) for team, seq in cursor.fetchall()}


@contextmanager
def snapshot() -> Iterator[None]:
    """Reads that see one moment of the database: a page's rows and the stream numbers they
    are as of. On SQLite a deferred read transaction is a snapshot (and, unlike the IMMEDIATE
    ones the engine writes in, takes no write lock: a thousand pages refetching wait for no
    writer, and no writer for them). On PostgreSQL, REPEATABLE READ (Read Committed takes a new
    snapshot per statement). Inside a transaction already open, that transaction holds."""

    connection = default_db()
    if connection.in_atomic_block:
        yield
        return
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("BEGIN DEFERRED")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("COMMIT")  # read only: nothing to keep or lose
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def renew_leases(held: dict[int, int], lease_expires_at: datetime) -> set[int]:
    """Move the lease of each running step (run id -> attempt) on to ``lease_expires_at``, if
    it is still that attempt's; the ids of the runs whose lease was."""
    pairs = sorted(held.items())
    return set(
        _ids(
            "UPDATE {Run} SET {Run.lease_expires_at} = %s WHERE {Run.status} = %s AND ("
            + " OR ".join(["({Run.id} = %s AND {Run.attempt} = %s)"] * len(pairs))
            + ") RETURNING {Run.id}",
            [lease_expires_at, Run.Status.RUNNING, *[value for pair in pairs for value in pair]],
        )
    )


# The channel on which PostgreSQL announces, as the transaction that changed a run's status
# commits, the run's id and new status (``id:status``, a trigger: migration 0018).
# actions.live.waiting listens, to wake the requests waiting on it in any process.
RUN_CHANGED_CHANNEL = "grundlag_run_changed"
# The trigger that sends them.
RUN_CHANGED_TRIGGER = "actions_run_status_notify"


def run_changes_notified(conn: Any) -> bool:
    """Whether the database has the trigger that NOTIFYs the runs' changes (it is missing while
    `migrate` has not run). ``conn``: a psycopg connection of the caller's (the listener's)."""
    found = conn.execute("SELECT 1 FROM pg_trigger WHERE tgname = %s", [RUN_CHANGED_TRIGGER]).fetchone()
    return found is not None
