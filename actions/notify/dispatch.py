"""From the event log to notifications: each event worth telling, once, to each recipient."""

from __future__ import annotations

import collections
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    close_old_connections,
    transaction,
)
from django.utils import timezone

from actions import background, engine
from actions.models import (
    DeliveryAttempt,
    Interrupt,
    Notification,
    Role,
    Run,
    RunEvent,
    TeamChannels,
    Webhook,
)
from actions.notify import delivery, process
from actions.notify.base import absolute, decided_meanwhile, not_sent
from actions.reads.records import run_fields, transcript_entry

logger = logging.getLogger(__name__)

Kind = RunEvent.Kind

# The event log's kinds that are told, as the event types subscribers choose from.
TYPES: dict[str, str] = {
    Kind.INTERRUPTED: "interrupt.created",
    Kind.APPROVED: "interrupt.decided",
    Kind.REJECTED: "interrupt.decided",
    Kind.EXPIRED: "interrupt.decided",
    Kind.ESCALATED: "interrupt.escalated",
    Kind.EXPIRING: "interrupt.expiring",
    # Told only to the members it @mentions, by mail.
    Kind.COMMENTED: "interrupt.commented",
    Kind.COMPLETED: "run.finished",
    Kind.FAILED: "run.finished",
    Kind.CANCELLED: "run.finished",
}

# Events older than this when the dispatcher first sees them (it was down that long) are not
# told any more: a day-old "new approval" is noise. They stay in the log.
LOOKBACK = timedelta(days=1)
BATCH = 200


def event_type(event: RunEvent) -> str | None:
    """What the event is to subscribers; None when it tells nothing (an approval counted
    toward several that are needed does not decide the interrupt)."""
    kind = TYPES.get(event.kind)
    if event.kind in (Kind.REJECTED, Kind.CANCELLED):
        # An interrupt's (rejected by someone, cancelled with its run) or its run's end.
        kind = "interrupt.decided" if event.interrupt_id is not None else "run.finished"
    detail = event.detail if isinstance(event.detail, dict) else {}
    counted = isinstance(detail.get("of"), int) and int(detail.get("approvals", 0)) < detail["of"]
    if event.kind == Kind.APPROVED and counted:
        return None
    if event.kind == Kind.COMMENTED and not detail.get("mentions"):
        return None
    return kind


# A notification made skipped (fan_out): why, for its delivery attempt.
SKIPPED_BECAUSE = "_skipped_because"


def interrupt_data(it: Interrupt) -> dict[str, Any]:
    """The interrupt as the API lists it (never its checkpoint), with its run and its page."""
    return {
        **transcript_entry(it),
        "run_id": it.run_id,
        "action": it.action,
        "team": it.team.slug,
        "expires_at": it.expires_at,
        "url": absolute(it.get_absolute_url()),
    }


def run_data(run: Run) -> dict[str, Any]:
    return {**run_fields(run), "team": run.team.slug, "url": absolute(run.get_absolute_url())}


class Subscribers:
    """The teams' webhooks and routing, read once for all the events of one dispatch (mostly one
    run's, one team's: its pause, decision and end)."""

    def __init__(self) -> None:
        self._hooks: dict[tuple[int, ...], list[Webhook]] = {}
        self._routing: dict[int, TeamChannels] = {}

    def hooks(self, team_ids: list[int], at: Any) -> list[Webhook]:
        """The teams' webhooks in force: a webhook hears of what happened after it was
        registered, not the day before."""
        key = tuple(sorted(team_ids))
        if key not in self._hooks:
            self._hooks[key] = engine.webhooks_of(key)
        return [hook for hook in self._hooks[key] if hook.created_at <= at]

    def routing(self, team_id: int) -> TeamChannels:
        if team_id not in self._routing:
            self._routing[team_id] = engine.team_channels(team_id) or TeamChannels(team_id=team_id)
        return self._routing[team_id]


def fan_out(event: RunEvent, subscribers: Subscribers | None = None) -> list[Notification]:
    """The event's notifications, not yet saved (the caller saves them with its Fanout row, and
    the delivery attempts of those made skipped)."""
    kind = event_type(event)
    if kind is None:
        return []
    subscribers = subscribers or Subscribers()
    it: Interrupt | None = None
    # Read as the engine reads (actions.engine.store): these are on every event's path.
    if kind.startswith("interrupt."):
        assert event.interrupt_id is not None  # the interrupt's own events name it
        it = engine.read_interrupt(event.interrupt_id)
        if it is None:
            raise Interrupt.DoesNotExist(f"interrupt {event.interrupt_id}")
        team_ids, data = it.team_ids, interrupt_data(it)
        if kind == "interrupt.commented":
            data["comment"] = {"by": event.actor_name, "body": event.detail.get("body", "")}
    else:
        run = engine.read_run_of_team(event.run_id)
        if run is None:
            raise Run.DoesNotExist(f"run {event.run_id}")
        team_ids, data = [run.team_id], run_data(run)
    # As JSON once, as the API would write it (times in ISO 8601), for every recipient.
    body = json.loads(json.dumps({"type": kind, "timestamp": event.at, "data": data}, cls=DjangoJSONEncoder))
    made: list[Notification] = []
    # Asking people for a decision made before this event was told (an API caller or an agent
    # answered within the gathering time): made skipped, saying why (still_for's reason), and
    # handed to no sender.
    decided = decided_meanwhile(kind, it.status) if it is not None else ""

    def notify(channel: str, key: str, payload: dict[str, Any], **fields: Any) -> None:
        notification = Notification(
            event=event,
            type=kind,
            channel=channel,
            message_id=f"msg_{event.pk}_{key}",
            payload=payload,
            **fields,
        )
        if decided and fields.get("recipient") is not None:
            notification.outcome, notification.attempts = Notification.Outcome.SKIPPED, 1
            setattr(notification, SKIPPED_BECAUSE, decided)
        made.append(notification)

    for hook in subscribers.hooks(team_ids, event.at):
        if kind in hook.events:
            notify(Notification.Channel.WEBHOOK, f"w{hook.pk}", body, webhook=hook)
    if it is not None and kind == "interrupt.commented":
        _to_mentioned(it, event, body, notify)
    elif it is not None:
        # An interrupt its run's end cancelled is told by its own event (interrupt.decided): a
        # message that asked in Slack says so.
        _to_people(it, kind, body, notify, subscribers.routing)
    return made


def _to_people(
    it: Interrupt, kind: str, body: dict[str, Any], notify: Any, routing_of: Callable[[int], TeamChannels]
) -> None:
    """Each channel's share: to those who may decide it (its assignees, when it names any), or
    for a decision to whoever asked; routed by the team's choice of events and each person's."""
    # Escalated: the team it went to hears of it, with that team's routing.
    team_id = it.escalate_to_id if kind == "interrupt.escalated" and it.escalate_to_id else it.team_id
    routing = routing_of(team_id)
    people = _people(it, kind, [team_id] if kind == "interrupt.escalated" else it.team_ids)
    for transport in delivery.TRANSPORTS.values():
        transport.to_people(it, kind, body, notify, routing, people)


def _to_mentioned(it: Interrupt, event: RunEvent, body: dict[str, Any], notify: Any) -> None:
    """A comment's @mentions: each member named, on each channel that tells a person."""
    names = [str(name) for name in (event.detail.get("mentions") or [])]
    for user in engine.people(it.team_ids, Role.WORK, usernames=names):
        for transport in delivery.TRANSPORTS.values():
            transport.to_mentioned(user, body, notify)


def _people(it: Interrupt, kind: str, team_ids: list[int]) -> list[Any]:
    if kind == "interrupt.decided":
        # The one who asked, told of the answer (not when they decided it themselves).
        asked_by = it.run.started_by_id
        if asked_by is None or asked_by == it.decided_by_id:
            return []
        # Still in its team: someone who has left hears no more of it (an auditor never did).
        return engine.people(team_ids, Role.WORK, user_id=asked_by)
    # Whose role decides (a viewer follows the inbox itself; an auditor, the history).
    return engine.people(team_ids, Role.DECIDE, usernames=it.assignees or None)


# In this process, the events of one run are worked out one dispatch at a time (the
# notifications' worker runs a dispatch per commit that asked, in several threads, and a run's
# pause, decision and end follow each other closely): a dispatch waits for the one working on
# the run's event, then finds it told, rather than working it out again to lose the race for its
# Fanout row. Striped (a lock per run would have to be forgotten again), and held for one event
# at a time, so dispatches of other runs go on meanwhile. Across processes the Fanout row alone
# keeps an event from being told twice.
_TURNS = [threading.Lock() for _ in range(64)]


class _Recent:
    """The events this process told in the last minute: a dispatch that waited its turn for one
    finds it told without asking the database (the processes that paused and decided a run each
    ask for a dispatch: two tasks, each listing the same events). Known by id and time, so that
    an id used again (a database emptied under a running worker) is not taken for the one told;
    forgotten after a minute, so that what a restored database lost is told again by the next
    round. Bounded; what it forgot, the Fanout row says."""

    SECONDS = 60.0

    def __init__(self, size: int = 4096) -> None:
        self._order: collections.deque[tuple[int, Any]] = collections.deque(maxlen=size)
        self._told_at: dict[tuple[int, Any], float] = {}
        self._lock = threading.Lock()

    def add(self, event: RunEvent) -> None:
        key = (event.pk, event.at)
        with self._lock:
            if key not in self._told_at:
                if len(self._order) == self._order.maxlen:
                    self._told_at.pop(self._order[0], None)
                self._order.append(key)
            self._told_at[key] = time.monotonic()

    def has(self, event: RunEvent) -> bool:
        told_at = self._told_at.get((event.pk, event.at))
        return told_at is not None and time.monotonic() - told_at < self.SECONDS


_told = _Recent()


def _turn(run_id: int) -> threading.Lock:
    return _TURNS[run_id % len(_TURNS)]


def dispatch(runs: Collection[int] | None = None, *, after_id: int = 0) -> int:
    """Fan out the recent events not yet fanned out, oldest first; how many notifications were
    made. ``runs``: only those runs' events (what a commit asked for: found by the runs'
    index, however long the log); ``after_id``: only events after it. Safe to run anywhere at
    once: each event is taken by one (its Fanout row)."""
    made = 0
    subscribers = Subscribers()
    for event in engine.events_to_tell(list(TYPES), timezone.now() - LOOKBACK, runs, after_id, BATCH):
        with _turn(event.run_id):
            told = _tell(event, subscribers)
        if told:
            made += len(told)
            # Now, or once a transaction the caller holds open commits. Each webhook goes alone.
            hooks = {n.pk for n in told if n.webhook_id is not None}
            due = [n.pk for n in told if n.outcome == Notification.Outcome.PENDING]
            if due:
                transaction.on_commit(functools.partial(delivery.schedule_all, due, alone=hooks))
    return made


def _tell(event: RunEvent, subscribers: Subscribers) -> list[Notification] | None:
    """Work out the event's notifications and save them with its Fanout row; None when it was
    told already (by another dispatcher)."""
    # Worked out before the transaction, which then only writes: on SQLite a transaction holds
    # the database's one write lock from its start, and a run's step would wait for the reads
    # and the rendering of a big team's notifications.
    # Told meanwhile by another dispatcher of this process: not worked out twice. One of
    # another process is found out by the Fanout row (below): rare, and cheaper than asking
    # the database about every event first.
    if _told.has(event):
        return None
    try:
        notifications = fan_out(event, subscribers)
    except (OperationalError, InterfaceError, ProgrammingError):
        # The database went away, or does not have what this code reads (a process older or
        # newer than the migrations, mid-upgrade): this round stops, and a later one tells it.
        raise
    except Exception:
        # One event that cannot be told (its interrupt deleted meanwhile, a bug) must not hold
        # up every later one: it is marked told, and the log says why.
        logger.exception("event %s: its notifications could not be made; skipped", event.pk)
        notifications = []
    try:
        if notifications or transaction.get_connection().in_atomic_block:
            with transaction.atomic():
                if not engine.fanned_out(event.pk):
                    return None  # another dispatcher took it
                # One insert for a big team's notifications, not one each.
                made = Notification.objects.bulk_create(notifications)
                DeliveryAttempt.objects.bulk_create(
                    not_sent(why, notification=n) for n in made if (why := getattr(n, SKIPPED_BECAUSE, None))
                )
        elif engine.fanned_out(event.pk):  # alone, a statement is a transaction of its own
            made = []
        else:
            return None
    except IntegrityError:
        return None  # what it names went meanwhile (a webhook deleted): the next round tells it
    transaction.on_commit(functools.partial(_told.add, event))
    return made


class MissedEvents:
    """The periodic round's reach: every event of the last day that no commit's dispatch told
    (its process died first, or a signal was lost). Once a round finds no backlog, the events
    older than SETTLED are behind it: the next rounds start after them, so their query costs
    what the last minutes logged, not the whole day. Every LOOK_AGAIN the round looks at the
    whole day again: should an event have been committed later than SETTLED after it was
    logged (a clock apart, a transaction held open), it is told then."""

    SETTLED = timedelta(minutes=5)  # far longer than any transaction that logs an event
    LOOK_AGAIN = timedelta(minutes=15)

    def __init__(self) -> None:
        self.after_id = 0
        self.since_whole_day = timezone.now()
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            began = timezone.now()
            if began - self.since_whole_day >= self.LOOK_AGAIN:
                self.after_id, self.since_whole_day = 0, began
            before = RunEvent.objects.filter(at__lt=began - self.SETTLED, pk__gt=self.after_id)
            settled = before.order_by("-at", "-id").values_list("pk", flat=True).first()
            made = dispatch(after_id=self.after_id)
            backlog = RunEvent.objects.filter(
                at__gte=began - LOOKBACK, kind__in=list(TYPES), fanout__isnull=True, pk__gt=self.after_id
            )
            if settled is not None and not backlog.filter(pk__lte=settled).exists():
                self.after_id = settled
            return made


dispatch_missed = MissedEvents()


def periodic_round() -> int:
    """Every few seconds, wherever notifications are sent (Celery beat's task, the embedded
    notifier, the server without one): fan out what no commit's dispatch did, then send what
    is due (new ones missed, retries, digests), whatever became of the fanning out; how many
    were handed to their senders."""
    try:
        dispatch_missed()
    except Exception:
        logger.exception("fanning out missed events failed; the next round tries again")
    return delivery.deliver_due()


# After a commit that logged something worth telling, the dispatcher runs soon, once however
# many commits asked for it meanwhile, for the runs they changed.
_soon = threading.Lock()
_wanted = threading.Event()
_wanted_runs: set[int] = set()
_wanted_lock = threading.Lock()
EVERY_RUN = -1  # in _wanted_runs: a change that names no run (deadlines): every recent event


def dispatch_soon(
    sender: Any = None,
    *,
    changes: Any = (),
    runs: Collection[int] = (),
    run_id: int | None = None,
    **kwargs: Any,
) -> None:
    """The engine's team_changed signal (after commit), and what else asks for a dispatch:
    the runs it names (``changes``', ``runs`` or ``run_id``), or, naming none, every recent
    event. In the embedded server, its notifier process does it."""
    wanted = {change.run_id for change in changes} | set(runs) | ({run_id} if run_id is not None else set())
    if (notifier := process.current) is not None:
        notifier.wake(wanted or None)
        return
    with _wanted_lock:
        _wanted_runs.update(wanted or {EVERY_RUN})
    _wanted.set()
    delivery.run_in_background(_dispatch_wanted)


def on_discussed(sender: Any = None, *, run_id: int, mentions: list[str], **kwargs: Any) -> None:
    """The engine's discussed signal: a comment that names someone is told soon."""
    if mentions:
        dispatch_soon(run_id=run_id)


def on_run_changed(sender: Any = None, *, run_id: int, finished: bool = False, **kwargs: Any) -> None:
    """The engine's run_changed signal: a run that finished is told (run.finished)."""
    if finished:
        dispatch_soon(run_id=run_id)


def _send(runs: list[int] | None) -> None:
    try:
        background.submit(background.DISPATCH, runs)
    except Exception:
        logger.warning("the broker refused a dispatch; the periodic round tells it", exc_info=True)


def _dispatch_wanted() -> None:
    while _wanted.is_set():
        if not _soon.acquire(blocking=False):
            return  # one is running; it sees _wanted set, and goes round again
        try:
            while _wanted.is_set():
                # What the commits that follow within the gathering time ask for goes along:
                # a run's pause, decision and end are one dispatch, not three tasks, each taking
                # CPU from the steps and requests that are waited for.
                if (gather := settings.GRUNDLAG_DISPATCH_GATHER_SECONDS) > 0:
                    time.sleep(gather)
                _wanted.clear()
                with _wanted_lock:
                    runs = set(_wanted_runs)
                    _wanted_runs.clear()
                wanted = None if EVERY_RUN in runs else sorted(runs)
                # The embedded notifier fans out itself; in the scaled setup the workers do (the
                # `notify` queue), not the web process that committed the change.
                if delivery.delivers_here():
                    dispatch(wanted)
                else:
                    _send(wanted)
        except Exception:
            logger.exception("dispatching notifications failed; the periodic round retries")
        finally:
            _soon.release()
            close_old_connections()
