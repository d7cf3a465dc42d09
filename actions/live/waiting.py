"""`Prefer: wait` without polling: an API request waiting for a run to settle is woken when the
run changes, then reads the row, which stays the truth.

- A change made in this process (the embedded server's steps, a decision through this server)
  sends the engine's run_changed signal here, after commit.
- On PostgreSQL, a trigger NOTIFYs each change of a run to a status a request may wait for
  (Run.SETTLED), with the run's id and new status (migration 0018): the database delivers it as
  the transaction that made the change commits, and never if it rolls back. One connection per
  web process LISTENs (``_Listener``) and wakes the requests waiting on that run, whichever
  process made the change (a Celery worker of the scaled setup, another daphne, an admin).

A request is woken only by a change to a status it waits for (a start waits for the run to
settle: its claim, queued to running, wakes nobody; a decided approval waits for the run to
finish), so it reads its run once per change that may end its wait, not once per change.

Should a wake-up be lost, the waiter's timeout is a poll that still finds the change: slow
(settings.GRUNDLAG_WAIT_POLL_SECONDS) while every such change reaches this process, fast while
one may not (``covers_all_changes``: the listener is down, the database lacks the trigger, or
another process may run the step on a database without notifications).

A wake-up through the channel layer (Redis pub/sub) was tried first and taken out: in one CI
run it missed every push, for a reason never found. NOTIFY is the database's own, transactional,
and needs nothing but the connection the engine already has.

What one token may take of a process, so that none stalls the others (the API's and the MCP
endpoint's): its requests held waiting at once (``place_to_wait``,
settings.GRUNDLAG_MAX_WAITS_PER_TOKEN; past it a request is answered at once), and its rate of
requests (``TokenRateThrottle``, settings.GRUNDLAG_API_RATE; past it, 429)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest
from ninja.throttling import BaseThrottle, SimpleRateThrottle

from actions.engine import queue, store
from actions.models import ApiToken, Run

logger = logging.getLogger(__name__)

# The listening connection's name in PostgreSQL (pg_stat_activity.application_name).
APPLICATION_NAME = "grundlag-listen"

# A waiter: its request's loop, the event it waits on, and the statuses it waits for (None: any).
_Entry = tuple[asyncio.AbstractEventLoop, asyncio.Event, frozenset[str] | None]

_waiters: dict[int, set[_Entry]] = {}
_lock = threading.Lock()
# Set while the server stops (stop_waits): every wait ends, answered with what is true now.
_stopping = threading.Event()


def on_run_changed(sender: Any, *, run_id: int, status: str | None = None, **kwargs: Any) -> None:
    """The engine's run_changed signal, from whichever thread committed the change."""
    _wake(_waiters_of([(run_id, status)]))


def stop_waits() -> None:
    """The server is stopping: every request waiting on a run answers now, with the run as it
    is (a 202 to an API client, which reads it again from whichever server is up), and new
    waits are answered at once, instead of each holding the shutdown until its time is up."""
    _stopping.set()
    _wake(_waiters_of(None))


def _waiters_of(changes: Iterable[tuple[int, str | None]] | None) -> list[_Entry]:
    """The waiters these changes (a run, the status it changed to; None: unknown) may concern;
    None: every waiter."""
    with _lock:
        if changes is None:
            return [entry for entries in _waiters.values() for entry in entries]
        return [
            entry
            for run_id, status in changes
            for entry in _waiters.get(run_id, ())
            if status is None or entry[2] is None or status in entry[2]
        ]


def _wake(waiters: list[_Entry]) -> None:
    for loop, event, _statuses in waiters:
        # A closed loop (the server is stopping) has nobody waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(event.set)


class _Waiter:
    """A request waiting on a run: woken (its event set, on its loop) by the run's changes to
    one of ``statuses`` (None: to any) once it has joined, from whichever thread joins it."""

    def __init__(self, statuses: Collection[str] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()
        self.entry: _Entry = (self.loop, self.changed, None if statuses is None else frozenset(statuses))
        self.run_id: int | None = None
        self.left = False

    def join(self, run_id: int) -> None:
        """Wake on the run's changes from now on; not once it has left (a request cancelled,
        its client gone, while its thread was still making its change)."""
        listen()
        with _lock:
            if self.left:
                return
            _waiters.setdefault(run_id, set()).add(self.entry)
            self.run_id = run_id

    def leave(self) -> None:
        with _lock:
            self.left = True
            if self.run_id is None:
                return
            waiting = _waiters.get(self.run_id)
            if waiting is not None:
                waiting.discard(self.entry)
                if not waiting:
                    del _waiters[self.run_id]


@asynccontextmanager
async def changes_of(run_id: int, statuses: Collection[str] | None = None) -> AsyncIterator[asyncio.Event]:
    """An event set whenever the run changes (to one of ``statuses``; None: to any) while the
    block runs (clear it before reading). Joined before the block starts, so a change after the
    block's first read is never missed."""
    waiter = _Waiter(statuses)
    waiter.join(run_id)
    try:
        yield waiter.changed
    finally:
        waiter.leave()


# How soon a waiter reads the run again when nothing woke it. While every change it waits for
# wakes it here (covers_all_changes), that is a fallback for a lost wake-up, after
# settings.GRUNDLAG_WAIT_POLL_SECONDS. While a change may not (another process changes the run on
# a database without notifications, or the listener is reconnecting), the poll is how the change
# is found: after the first of these, then twice as long each time, up to the second.
FAST_POLL_SECONDS = (0.01, 0.1)

T = TypeVar("T")
_NOT_YET: Any = object()


async def settle(
    act: Callable[[], int],
    seconds: float | None,
    done: Collection[str],
    describe: Callable[[Run], T],
) -> T:
    """Do ``act`` (which names a run: the one it started, decided on, or looked up), then wait
    for that run: its description once its status is one of ``done``, or once ``seconds`` have
    passed (None: no limit; 0: at once). Woken by the run's changes to those statuses, read
    again should a wake-up be lost.

    The waiter joins right after ``act``, before the first read, so a change after that read is
    never missed. ``act``, the reads and the description run in the request's thread, each
    read together with what follows it: a request that waits for a paused run crosses between
    the event loop and its thread twice, not six times (each crossing waits its turn for the
    interpreter, behind the step a busy server is running)."""
    deadline: float | None = None  # from the change on, as before there was one to wait for
    fast = FAST_POLL_SECONDS[0]
    waiter = _Waiter(done)

    def read(run_id: int) -> T:
        run = store.read_run(run_id)
        if run is None:
            raise Run.DoesNotExist(f"run {run_id} is gone")  # deleted while waited for
        timed_out = _stopping.is_set() or (deadline is not None and deadline - time.monotonic() <= 0)
        return describe(run) if run.status in done or timed_out else _NOT_YET

    def first() -> T:
        nonlocal deadline
        run_id = act()
        deadline = None if seconds is None else time.monotonic() + seconds
        if seconds != 0:
            waiter.join(run_id)  # before the read: a change after it wakes this request
        return read(run_id)

    try:
        result = await sync_to_async(first)()
        while result is _NOT_YET:
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if covers_all_changes():
                delay = settings.GRUNDLAG_WAIT_POLL_SECONDS
            else:
                delay, fast = fast, min(fast * 2, FAST_POLL_SECONDS[1])
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(min(delay, remaining), 0)):
                    await waiter.changed.wait()
            waiter.changed.clear()  # before reading: a change after the read sets it again
            assert waiter.run_id is not None
            result = await sync_to_async(read)(waiter.run_id)
        return result
    finally:
        waiter.leave()


async def wait_for(run_id: int, seconds: float | None, done: Collection[str]) -> Run:
    """The run, read once its status is one of ``done``, or once ``seconds`` have passed
    (None: no limit): ``settle`` with nothing to do first."""
    return await settle(lambda: run_id, seconds, done, lambda run: run)


def listen() -> None:
    """On PostgreSQL, start listening for run changes, if this process does not already (the
    ASGI application calls it as it starts, so the first waiting request finds it listening)."""
    _Listener.ensure_started()


def stop_listening() -> None:
    """Close the listening connection (a test's database is then free to be dropped)."""
    _Listener.stop()


def covers_all_changes() -> bool:
    """Whether every change of a run that a request may wait for wakes its waiters here: the
    database's notifications are being listened to (and its trigger sends them), or (on a
    database without them) the steps run in this process."""
    if _Listener.wanted():
        return _Listener.listening.is_set() and _Listener.told.is_set()
    return queue.runs_here()


class _Listener:
    """This process's LISTEN connection to PostgreSQL, in a daemon thread of its own: it wakes
    the waiters of each run the database names. Reconnects with backoff when the connection
    fails, and wakes every waiter when it (re)connects: what was notified meanwhile is lost, so
    each reads its run again."""

    # Set while the connection is listening; the waiters poll slowly only then, and only while
    # the database has the trigger that sends the notifications (migration 0018: a process
    # started before `migrate` finds it missing, and polls fast until it is there).
    listening = threading.Event()
    told = threading.Event()
    # How long the connection may sit silent before it is checked with a statement (a dead peer
    # otherwise goes unnoticed); the longest wait between attempts to reconnect.
    KEEPALIVE_SECONDS = 30.0
    MAX_BACKOFF_SECONDS = 10.0
    STOP_CHECK_SECONDS = 0.5

    _stopping = threading.Event()

    _thread: threading.Thread | None = None
    _start_lock = threading.Lock()

    @staticmethod
    def wanted() -> bool:
        return bool(connections[DEFAULT_DB_ALIAS].vendor == "postgresql")

    @classmethod
    def ensure_started(cls) -> None:
        if cls._thread is not None and cls._thread.is_alive():
            return
        if not cls.wanted():
            return
        with cls._start_lock:
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="grundlag-listen", daemon=True)
                cls._thread.start()

    @classmethod
    def stop(cls) -> None:
        with cls._start_lock:
            thread, cls._thread = cls._thread, None
            if thread is None:
                return
            cls._stopping.set()
            thread.join()
            cls._stopping.clear()

    @classmethod
    def _check_trigger(cls, conn: Any) -> None:
        if store.run_changes_notified(conn):
            cls.told.set()
        elif cls.told.is_set() or not cls.listening.is_set():
            cls.told.clear()
            logger.warning(
                "the database has no %s trigger (run `manage.py migrate`): waiting requests poll meanwhile",
                store.RUN_CHANGED_TRIGGER,
            )

    @classmethod
    def _run(cls) -> None:
        import psycopg  # noqa: PLC0415 (PostgreSQL's driver, only on PostgreSQL)

        backoff = 0.5
        while cls.wanted() and not cls._stopping.is_set():
            try:
                params = {
                    **connections[DEFAULT_DB_ALIAS].get_connection_params(),
                    "application_name": APPLICATION_NAME,  # in pg_stat_activity
                    "autocommit": True,
                }
                with psycopg.Connection.connect(**params) as conn:
                    conn.execute(f"LISTEN {store.RUN_CHANGED_CHANNEL}")
                    cls._check_trigger(conn)
                    cls.listening.set()
                    _wake(_waiters_of(None))  # whatever changed before this LISTEN
                    backoff = 0.5
                    checked = time.monotonic()
                    while not cls._stopping.is_set():
                        for note in conn.notifies(timeout=cls.STOP_CHECK_SECONDS):
                            with contextlib.suppress(ValueError):
                                _wake(_waiters_of([_parsed(note.payload)]))
                        if time.monotonic() - checked > cls.KEEPALIVE_SECONDS:
                            cls._check_trigger(conn)  # a statement, and `migrate` may have run
                            checked = time.monotonic()
                    return
            except Exception:
                logger.warning(
                    "not listening for run changes (waiting requests poll meanwhile); reconnecting in %.1f s",
                    backoff,
                    exc_info=True,
                )
            finally:
                cls.listening.clear()
                _wake(_waiters_of(None))  # they poll fast until the connection is back
            cls._stopping.wait(backoff)
            backoff = min(backoff * 2, cls.MAX_BACKOFF_SECONDS)


def _parsed(payload: str) -> tuple[int, str | None]:
    """A notification's run id and status (``id:status``; a bare id, from a process of an
    earlier version during a rolling upgrade, wakes every waiter of the run). Raises ValueError."""
    run_id, _, status = payload.partition(":")
    return int(run_id), status or None


# What one token may take of a process


class Places:
    """At most so many at once per key in this process: ``take`` gives a place (true) or says
    there is none left (false), and gives it back however its block ends (answered, failed, or
    cancelled as the client left), or sooner, when its holder says so (``_Place.give_back``).
    A process that stops takes its counts with it."""

    def __init__(self) -> None:
        self.held: dict[Any, int] = {}  # a key with none held is not in it
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self, key: Any, most: int) -> Iterator[_Place]:
        with self._lock:
            held = self.held.get(key, 0)
            placed = held < most
            if placed:
                self.held[key] = held + 1
        place = _Place(self, key, placed)
        try:
            yield place
        finally:
            place.give_back()

    def _give_back(self, key: Any) -> None:
        with self._lock:
            if self.held[key] > 1:
                self.held[key] -= 1
            else:
                del self.held[key]


class _Place:
    """A place taken (true) or refused (false); given back once, however often it is asked to."""

    def __init__(self, places: Places, key: Any, placed: bool) -> None:
        self._places, self._key, self._held = places, key, placed
        self.placed = placed

    def __bool__(self) -> bool:
        return self.placed

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._places._give_back(self._key)


# Each token's requests held waiting in this process now.
waits = Places()


@contextlib.contextmanager
def place_to_wait(token_id: int | None) -> Iterator[bool]:
    """Whether a request of the token may be held waiting (its place taken until the block
    ends); False while settings.GRUNDLAG_MAX_WAITS_PER_TOKEN of the token's requests are held
    here already, and such a request is answered at once with what there is. Counted in this
    process: what a waiting request holds (its thread's turns, its reads) is this process's.
    (None: a caller of no token, in-process, is not counted.)"""
    if token_id is None:
        yield True
        return
    with waits.take(token_id, settings.GRUNDLAG_MAX_WAITS_PER_TOKEN) as place:
        yield bool(place)


class TokenRateThrottle(BaseThrottle):
    """settings.GRUNDLAG_API_RATE per API token (the API and /mcp/ take tokens only):
    a ninja throttle counting in Django's cache (Redis, shared by every process, when there is
    one; see _Window), keyed by the token's id, read from the settings at each request. ninja
    keeps one throttle for every request of the API and its window of the request being
    checked on the throttle, between allow_request() and wait(): here the window is one of
    the request's own, kept for its thread (a sync view's request runs on a thread no other
    request uses meanwhile; an async view's checks run on the event loop with nothing in
    between)."""

    def __init__(self) -> None:
        self._checked = threading.local()

    def allow_request(self, request: HttpRequest) -> bool:
        rate = settings.GRUNDLAG_API_RATE
        if not rate:
            return True
        window = _Window(rate)
        self._checked.window = window
        return window.allow_request(request)

    def wait(self) -> float | None:
        window: _Window = self._checked.window
        return window.wait()

    def retry_after(self, request: HttpRequest) -> int | None:
        """For a caller outside ninja (the MCP endpoint): None while the request is allowed,
        else the seconds its client should wait (Retry-After)."""
        if self.allow_request(request):
            return None
        return math.ceil(self.wait() or 1)


class _Window:
    """One request's check against the rate of its token or user: a fixed window of the rate's
    period, counted in the cache with ``add`` then ``incr`` (Redis's INCR when it is shared):
    two requests of one token at once, in any processes, each count. (ninja's own throttle
    reads its history, appends and writes it back: concurrent requests overwrote each other's
    and a burst went past the rate.) A window allows up to twice the rate across its edge."""

    def __init__(self, rate: str) -> None:
        count, period = SimpleRateThrottle.parse_rate(cast(Any, SimpleRateThrottle), rate)  # its periods
        self.num_requests, self.duration = count or 1, period or 1
        self.retry: float | None = None

    def allow_request(self, request: HttpRequest) -> bool:
        auth = getattr(request, "auth", None)
        if isinstance(auth, ApiToken):
            ident = f"token-{auth.pk}"
        elif (user := getattr(request, "user", None)) is not None and user.is_authenticated:
            ident = f"user-{user.pk}"
        else:
            return True  # refused without a token or a user anyway
        now = time.time()
        start = int(now // self.duration) * self.duration
        key = f"grundlag:rate:{ident}:{start}"
        cache.add(key, 0, timeout=self.duration + 1)
        try:
            count = cache.incr(key)
        except ValueError:  # the window's key expired between the two: a new window
            cache.set(key, 1, timeout=self.duration + 1)
            count = 1
        self.retry = None if count <= self.num_requests else max(start + self.duration - now, 0.0)
        return self.retry is None

    def wait(self) -> float | None:
        return self.retry
