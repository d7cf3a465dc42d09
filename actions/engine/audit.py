"""Tamper evidence for the event log.

Every event carries two SHA-256 hashes, written in the transaction that logs it: ``hash`` chains
it to the event before it in the whole log (its ``seq``), ``run_hash`` to the one before it in
its run. Each hash covers the event's content and the hash before it, so an event edited,
deleted or slipped in directly in the database breaks its chains from there on.
``verify()`` recomputes both chains and names the first event that does not fit
(`manage.py verify_audit`; the history page shows the last verification). The head of the whole
chain is published every day (``publish_head``: the log, the admin, webhooks subscribed to
``audit.head``): someone with the database could recompute every hash after a change, but not
the copies of the heads held elsewhere, which ``verify()`` also checks. ``prune_runs`` leaves an
anchor for each event it deletes (its place and hash), so what remains still verifies; the
archive it writes carries every event's hashes.

Writers take the chain's head row (AuditChain) as their transaction ends: on PostgreSQL the
transactions that log events commit one after another from there; SQLite's writers do anyway.
"""

from __future__ import annotations

import hashlib
import json
import json as json_module
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from actions.engine import store
from actions.models import GENESIS, AuditAnchor, AuditChain, AuditCheck, AuditHead, Interrupt, Run, RunEvent

logger = logging.getLogger(__name__)

CHUNK = 5000
MAX_PROBLEMS = 20
PUBLISH_EVERY = timedelta(days=1)

# Sent once a head published is committed: published (the AuditHead). The webhooks subscribed
# to audit.head are told (actions.notify).
head_published = Signal()


def _canonical(value: Any) -> Any:
    """The JSON value as every database gives it back: a float with no fraction as the integer
    its JSON text denotes (PostgreSQL's jsonb reads 1e23 back as 10**23, not int(1e23)), keys
    as JSON writes them (None as "null")."""
    if isinstance(value, float) and value.is_integer():
        return int(Decimal(repr(value)))
    if isinstance(value, dict):
        return {_key(key): _canonical(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    return value


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    return repr(key) if isinstance(key, float) else str(key)


def moment(at: datetime) -> str:
    """A moment as the hashes cover it (UTC, to the microsecond)."""
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def content(
    seq: int, run_id: int, interrupt_id: int | None, kind: str, actor_name: str, detail: Any, at: datetime
) -> bytes:
    """What an event's hashes cover, as bytes: every column but its id, its actor's id (set to
    NULL when the user is deleted; the name stays) and the hashes, as a JSON array (keys
    sorted, no spaces, ASCII)."""
    return f"[{int(seq)}{rest(run_id, interrupt_id, kind, actor_name, detail, at)}".encode()


def rest(run_id: int, interrupt_id: int | None, kind: str, actor_name: str, detail: Any, at: datetime) -> str:
    """An event's content after its place in the chain (ASCII): what PostgreSQL's
    grundlag_append_journal (migration 0021) is given to hash, once it has numbered it."""
    return (
        f",{int(run_id)},{_JSON(interrupt_id)},{_JSON(kind)},"
        f'{_JSON(actor_name)},{_JSON(_canonical(detail))},"{moment(at)}"]'
    )


_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode


# What the audit shows of a decision and of a run's end lives on the interrupt's and the run's
# rows; a digest of it goes into the detail of the event that records it, written in the same
# transaction, so the chain covers it: verify() names a row edited since.


def _digest(value: Any) -> str:
    return hashlib.sha256(_JSON(_canonical(value)).encode()).hexdigest()


def decision_record(
    status: str, answer: Any, reason: str, decided_by_name: str, decided_via: str, edited_arguments: Any
) -> str:
    """The digest of a decision as its interrupt's row keeps it: who, the answer, via, the
    reason and the edited arguments."""
    return _digest([status, answer, reason or "", decided_by_name or "", decided_via or "", edited_arguments])


def run_record(status: str, output: Any, error: str) -> str:
    """The digest of a run's end as its row keeps it: how it ended, its output or its error."""
    return _digest([status, output, error or ""])


def link(previous: str, body: bytes) -> str:
    return hashlib.sha256(previous.encode() + body).hexdigest()


def append(
    events: Sequence[Sequence[Any]],
    streams: dict[int, int] | None = None,
    *,
    numbered: Callable[[dict[int, int]], None] | None = None,
    last: bool = False,
) -> None:
    """Append events to run logs (run_id, interrupt_id, kind, actor_id, actor_name, detail,
    at), each written with its place in the chain and its hashes, in the caller's transaction
    or one of its own; and move the teams' inbox streams on by ``streams`` (team: count of
    changes), last, in the same transaction. ``numbered`` is given each team's new last number.
    On PostgreSQL all of it is one statement (store.append_journal); with ``last`` (nothing else
    is written in the transaction after it: journal.atomic) that statement may be sent with the
    transaction's COMMIT, and ``numbered`` is then called as it has committed, before its
    ``on_commit`` callbacks run."""
    if not events and not streams:
        return
    with nullcontext() if transaction.get_connection().in_atomic_block else transaction.atomic():
        if store.journal_in_one_call():
            rows = []
            for run_id, interrupt_id, kind, actor_id, actor_name, detail, at in events:
                rows.append(
                    [
                        run_id,
                        interrupt_id,
                        kind,
                        actor_id,
                        actor_name,
                        detail.value,
                        at,
                        rest(run_id, interrupt_id, kind, actor_name, detail.value, at),
                    ]
                )
            store.append_journal(rows, streams or {}, numbered, last=last)
            return
        if events:
            store.insert_events(chained(events))
        numbers = store.advance_streams(streams) if streams else {}
        if numbered is not None:
            numbered(numbers)


def chained(events: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """The events (run_id, interrupt_id, kind, actor_id, actor_name, detail, at; the detail a
    sql.Json), each with its seq, hash and run_hash appended. What the JSON column will give
    back of a detail differently (an integral float, a tuple, a key that is not a string) the
    canonical form makes the same. In the caller's transaction, which must end soon: the
    chain's head row stays locked until it does (inserting them moves it on)."""
    seq, head, run_heads = store.lock_audit_chain(sorted({int(event[0]) for event in events}))
    rows = []
    for event in events:
        run_id, interrupt_id, kind, _actor_id, actor_name, detail, at = event
        seq += 1
        body = content(seq, run_id, interrupt_id, kind, actor_name, detail.value, at)
        head = link(head, body)
        run_heads[run_id] = link(run_heads.get(run_id, GENESIS), body)
        rows.append([*event, seq, head, run_heads[run_id]])
    return rows


# Verification


@dataclass
class Report:
    events: int = 0
    seq: int = 0
    head: str = GENESIS
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)


def _events(order: Sequence[str], until: int | None) -> Iterator[RunEvent]:
    """Every event up to place ``until``, in ``order``, a chunk at a time (memory stays flat)."""
    rows = RunEvent.objects.order_by(*order)
    if until is not None:
        rows = rows.filter(seq__lte=until)
    rows = rows.only(
        "id",
        "run_id",
        "interrupt_id",
        "kind",
        "actor_id",
        "actor_name",
        "detail",
        "at",
        "seq",
        "hash",
        "run_hash",
    )
    yield from rows.iterator(chunk_size=CHUNK)


def _body(event: RunEvent) -> bytes:
    return content(
        event.seq or 0, event.run_id, event.interrupt_id, event.kind, event.actor_name, event.detail, event.at
    )


def verify(heads: Sequence[tuple[int, str]] = ()) -> Report:
    """Recompute both chains from the database; what does not fit, first things first.
    ``heads``: (place, hash) pairs published before, as held outside the database (the log, a
    webhook's receiver), checked as the database's own copies (AuditHead) are."""
    report = Report()
    # The head first: events committed while this reads are newer than it, and not judged.
    chain = AuditChain.objects.filter(pk=1).first()
    until = chain.seq if chain is not None else None
    anchors = dict(AuditAnchor.objects.values_list("seq", "hash"))
    unplaced = (
        RunEvent.objects.filter(seq__isnull=True).order_by("id").values_list("id", flat=True)[:MAX_PROBLEMS]
    )
    for event_id in unplaced:
        report.add(f"event {event_id} has no place in the chain: it was inserted directly in the database")
    published = [(head.seq, head.head, f"{head.at:%Y-%m-%d %H:%M} UTC") for head in AuditHead.objects.all()]
    published += [(int(seq), str(value), "outside the database") for seq, value in heads]
    wanted = {seq for seq, _, _ in published}
    previous, expected = GENESIS, 1
    hashes: dict[int, str] = {}
    for event in _events(["seq"], until):
        if event.seq is None:
            continue
        while expected < event.seq and expected in anchors:  # pruned: the anchor stands in
            previous, expected = anchors[expected], expected + 1
        if event.seq > expected:
            report.add(f"events {expected} to {event.seq - 1} of the chain are missing: deleted")
            expected = event.seq
        elif event.seq < expected:
            report.add(f"event {event.pk} repeats place {event.seq} of the chain: inserted out of order")
            continue
        if link(previous, _body(event)) != event.hash:
            report.add(
                f"event {event.pk} (place {event.seq}, run {event.run_id}, {event.kind}) does not match its"
                " hash: it was edited, or moved or inserted out of order"
            )
        previous, expected = event.hash, expected + 1
        if event.seq in wanted:
            hashes[event.seq] = event.hash
        report.events += 1
    while expected in anchors and (until is None or expected <= until):
        previous, expected = anchors[expected], expected + 1
    last = expected - 1
    report.seq, report.head = last, previous
    if chain is not None and (chain.seq, chain.head) != (last, previous):
        if chain.seq > last:
            report.add(f"events {last + 1} to {chain.seq} of the chain are missing: the newest were deleted")
        else:
            report.add(f"the chain's head says place {chain.seq}, the log ends at {last}: it was changed")
    for seq, head, where in sorted(published):
        known = hashes.get(seq) or anchors.get(seq)
        if seq and known != head:
            report.add(
                f"the head published {where} (place {seq}) is not the log's: the log was rewritten since"
            )
    _verify_runs(report, until)
    _verify_records(report, until)
    return report


DECISIONS = (RunEvent.Kind.APPROVED, RunEvent.Kind.REJECTED, RunEvent.Kind.EXPIRED, RunEvent.Kind.CANCELLED)
ENDS = (RunEvent.Kind.COMPLETED, RunEvent.Kind.FAILED, RunEvent.Kind.REJECTED, RunEvent.Kind.CANCELLED)


def _verify_records(report: Report, until: int | None) -> None:
    """The rows the audit shows against the digests their events carry (events written before
    they carried one are not covered)."""
    recorded = RunEvent.objects.filter(seq__isnull=False, detail__has_key="record").order_by("seq")
    if until is not None:
        recorded = recorded.filter(seq__lte=until)
    decided: dict[int, str] = {}
    ended: dict[int, str] = {}
    events = recorded.values_list("interrupt_id", "run_id", "kind", "detail")
    for interrupt_id, run_id, kind, detail in events.iterator(chunk_size=CHUNK):
        if interrupt_id is not None and kind in DECISIONS:
            decided[interrupt_id] = detail["record"]
        elif interrupt_id is None and kind in ENDS:
            ended[run_id] = detail["record"]
    ids = list(decided)
    for start in range(0, len(ids), CHUNK):
        rows = Interrupt.objects.filter(pk__in=ids[start : start + CHUNK]).values_list(
            "pk", "status", "answer", "reason", "decided_by_name", "decided_via", "edited_arguments"
        )
        for pk, status, answer, reason, by, via, edited in rows:
            if decision_record(status, answer, reason, by, via, edited) != decided[pk]:
                report.add(
                    f"interrupt {pk}'s decision (who, answer, via, reason or edited arguments) is not the"
                    " one its event recorded: it was edited in the database"
                )
    ids = list(ended)
    for start in range(0, len(ids), CHUNK):
        for pk, status, output, error in Run.objects.filter(pk__in=ids[start : start + CHUNK]).values_list(
            "pk", "status", "output", "error"
        ):
            if run_record(status, output, error) != ended[pk]:
                report.add(
                    f"run {pk}'s end (its status, output or error) is not the one its event recorded:"
                    " it was edited in the database"
                )


def verify_archive(path: Any) -> list[str]:
    """What of the anchors a prune left is not backed by its archive (prune_runs --archive): an
    anchor is a pruned event only if the archive, held apart from the database, has the event
    and its content still hashes to the anchor (someone who deleted runs and wrote anchors for
    them directly in the database has no such archive)."""
    anchors = dict(AuditAnchor.objects.values_list("seq", "hash"))
    known = anchors | dict(
        RunEvent.objects.filter(seq__in=[seq - 1 for seq in anchors]).values_list("seq", "hash")
    )
    backed: set[int] = set()
    problems: list[str] = []
    with Path(path).open() as archive:
        for line in archive:
            record = json_module.loads(line)
            for event in record.get("events", []):
                seq = event.get("seq")
                if seq not in anchors:
                    continue
                body = content(
                    seq, record["id"], event.get("interrupt"), event["kind"], event["actor"], event["detail"],
                    datetime.fromisoformat(event["at"]),
                )  # fmt: skip
                if (
                    event.get("hash") != anchors[seq]
                    or link(known.get(seq - 1, GENESIS), body) != anchors[seq]
                ):
                    problems.append(f"the archive's event at place {seq} does not hash to its anchor")
                backed.add(seq)
    missing = sorted(set(anchors) - backed)
    if missing:
        problems.append(
            f"{len(missing)} anchor(s) have no event in the archive (the first at place {missing[0]}):"
            " written without a prune, or the archive is not this log's"
        )
    return problems


def _verify_runs(report: Report, until: int | None) -> None:
    run_id, previous = None, GENESIS
    for event in _events(["run_id", "seq"], until):
        if event.seq is None:
            continue
        if event.run_id != run_id:
            run_id, previous = event.run_id, GENESIS
        if link(previous, _body(event)) != event.run_hash:
            report.add(
                f"run {event.run_id}'s chain breaks at event {event.pk} (place {event.seq}): an event of"
                " the run before it was deleted or changed, or this one was"
            )
        previous = event.run_hash  # go on from what the event says: each break is told once


def check(
    *, by: str = "verify_audit", heads: Sequence[tuple[int, str]] = (), archives: Sequence[Any] = ()
) -> AuditCheck:
    """Verify (against ``heads`` held outside the database, and the prunes' ``archives`` too),
    and record how it went (the history page shows the last one)."""
    report = verify(heads)
    for archive in archives:
        for problem in verify_archive(archive):
            report.add(f"{archive}: {problem}")
    if report.ok:
        logger.info(
            "audit chain verified by %s: %s events, head %s at %s", by, report.events, report.head, report.seq
        )
    else:
        logger.error("audit chain verification by %s FAILED: %s", by, "; ".join(report.problems))
    return AuditCheck.objects.create(
        ok=report.ok, events=report.events, seq=report.seq, head=report.head, problems=report.problems
    )


# Publication


def publish_head(now: datetime | None = None) -> AuditHead | None:
    """Publish the chain's head, once a day: recorded (the admin lists them), logged, and sent
    to the webhooks subscribed to audit.head. None when one was published less than a day ago."""
    now = now or timezone.now()
    last = AuditHead.objects.order_by("-at").first()
    if last is not None and now - last.at < PUBLISH_EVERY:
        return None
    chain = AuditChain.objects.filter(pk=1).first()
    seq, head = (chain.seq, chain.head) if chain is not None else (0, GENESIS)
    with transaction.atomic():
        published = AuditHead.objects.create(at=now, seq=seq, head=head)
        transaction.on_commit(lambda: head_published.send(AuditHead, published=published))
    logger.info("audit chain head published: place %s, sha256 %s", seq, head)
    return published


def daily() -> None:
    """The periodic round's share: publish the head (and verify) once a day."""
    if publish_head() is not None:
        check(by="the daily round")


# Pruning


def anchor(run_ids: Sequence[int]) -> int:
    """Before the runs' events are deleted: their places and hashes (the caller's transaction)."""
    rows = RunEvent.objects.filter(run_id__in=run_ids, seq__isnull=False).values_list("seq", "run_id", "hash")
    made = AuditAnchor.objects.bulk_create(
        (
            AuditAnchor(seq=int(seq or 0), run_id=run_id, hash=hash_)
            for seq, run_id, hash_ in rows.iterator(chunk_size=CHUNK)
        ),
        batch_size=1000,
        ignore_conflicts=True,
    )
    return len(made)
