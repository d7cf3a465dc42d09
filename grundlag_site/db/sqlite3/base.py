"""Django's SQLite backend, with writers that take turns promptly.

SQLite lets one writer at a time (a transaction here is BEGIN IMMEDIATE: it takes the write lock
at its start); the others wait in SQLite's busy handler, which sleeps 1, 2, 5, 10, 15 ms...
between tries. In the embedded server a run's step, a request and the notifier's deliveries
all write, so a step that found the lock taken a few times slept 30 ms for writes that each
held it well under one. Instead:

- the threads of one process queue on a lock of their own before SQLite's, so the next one
  begins the moment the last one commits;
- a transaction whose BEGIN finds the lock held by another process (the server and its
  notifier) tries again every fraction of a millisecond, up to the configured timeout;
- a process whose writes can wait (the notifier: ``yield_to_others()``) leaves the database
  alone after each of its transactions for as long as the transaction held it, so the
  server's writers get their turn however many mails it is sending.

And its connections are kept for the next thread. A request's connection is closed as it ends
(CONN_MAX_AGE 0), on whichever thread it ran (a kept one, actions.web.middleware.RequestThreads,
or /mcp/'s own), and the embedded worker's steps run in a pool's threads: every request and
every step opened one, about 2 ms on this project's schema (SQLite reads the schema again on a
new connection's first statement). A closed connection goes back to a small pool of its process
instead, and the next one opened on the same database file takes it (``_Idle``)."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
import time
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

_writer = threading.Lock()

_polite = False
MAX_YIELD_SECONDS = 0.05


class _Connection(sqlite3.Connection):
    """A connection that knows which process opened it, on which file, and when (``_Idle``)."""

    pid: int
    file: tuple[int, int] | None
    born: float


def _file(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    return stat.st_dev, stat.st_ino


class _Idle:
    """Open connections not in use, per database file and options, ready for the next thread.

    A connection is kept only when it is as a new one would be: no transaction open, nothing
    gone wrong on it. It is handed out only in the process that opened it (never across a
    fork: a child starts with none) and only while the file at its path is still the one it
    opened (a test database deleted and made again is a new file); otherwise it is closed. At
    most ``SIZE`` per database: beyond, a connection is closed as it was before. None is used
    past ``MAX_AGE_SECONDS`` (as with CONN_MAX_AGE elsewhere): whatever builds up on a
    connection lasts no longer than that. What a thread changed on one is undone as it is
    handed out (``DatabaseWrapper.get_new_connection``)."""

    SIZE = 8
    MAX_AGE_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[Any, ...], list[_Connection]] = {}

    def _usable(self, raw: _Connection, path: str) -> bool:
        return (
            raw.pid == os.getpid()
            and raw.file is not None
            and raw.file == _file(path)
            and time.monotonic() - raw.born <= self.MAX_AGE_SECONDS
        )

    def take(self, key: tuple[Any, ...], path: str) -> _Connection | None:
        while True:
            with self._lock:
                kept = self._kept.get(key)
                if not kept:
                    return None
                raw = kept.pop()
            if self._usable(raw, path):
                return raw
            with contextlib.suppress(sqlite3.Error):
                raw.close()

    def keep(self, key: tuple[Any, ...], path: str, raw: Any) -> bool:
        if not isinstance(raw, _Connection) or not self._usable(raw, path):
            return False
        try:
            if raw.in_transaction:
                return False
        except sqlite3.Error:  # closed under us: not one to keep
            return False
        with self._lock:
            kept = self._kept.setdefault(key, [])
            if len(kept) >= self.SIZE:
                return False
            kept.append(raw)
        return True

    def forked(self) -> None:
        """In a child process: the parent's connections are the parent's. Not closed here (that
        would touch the parent's locks and files), nor ever used: set aside for good. The lock
        is new too: a thread of the parent may have held it as the process forked."""
        _forked_away.append(self._kept)
        self._lock, self._kept = threading.Lock(), {}


_idle = _Idle()
_forked_away: list[Any] = []
os.register_at_fork(after_in_child=_idle.forked)


def yield_to_others() -> None:
    """This process's writes come after other processes' (see the module)."""
    global _polite
    _polite = True


@functools.lru_cache(maxsize=1024)
def _qmark(query: str) -> str:
    """Django's "format" style as SQLite's "qmark" (SQLiteCursorWrapper.convert_query), once per
    text: a site runs the same few hundred statements over and over, and the regular expression
    cost about as much as SQLite took to run a small one."""
    return str(base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%"))


class _CursorWrapper(base.SQLiteCursorWrapper):
    def convert_query(self, query: str, *, param_names: Any = None) -> str:
        if param_names is None:
            return _qmark(query)
        return str(super().convert_query(query, param_names=param_names))


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False
    _began = 0.0

    def create_cursor(self, name: str | None = None) -> Any:
        return self.connection.cursor(factory=_CursorWrapper)

    def _idle_key(self, conn_params: dict[str, Any]) -> tuple[Any, ...]:
        # What a new connection is opened with, and what is run on it as it opens.
        return (repr(sorted(conn_params.items())), self.settings_dict["OPTIONS"].get("init_command", ""))

    # Overridden: a kept connection is handed out instead of opening one (Django has no pool
    # for SQLite). tests/test_sqlite_writers.py fails when Django changes the methods below.
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        path = str(conn_params["database"])
        if not self.is_in_memory_db() and (raw := _idle.take(self._idle_key(conn_params), path)):
            # As a new one is set up: whatever a thread changed on it for itself is undone.
            timeout = float(conn_params.get("timeout", 5))
            raw.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            raw.execute("PRAGMA foreign_keys = ON")
            for init_command in self.init_commands:  # type: ignore[attr-defined]
                if init_command := init_command.strip():
                    raw.execute(init_command)
            return raw
        raw = super().get_new_connection({**conn_params, "factory": _Connection})
        raw.pid, raw.file, raw.born = os.getpid(), _file(path), time.monotonic()
        return raw

    # Overridden: the only place Django begins a transaction; the writers queue here first.
    def _start_transaction_under_autocommit(self) -> None:
        if not self._holds_writer:
            timeout = float(self.settings_dict["OPTIONS"].get("timeout", 5))
            if not _writer.acquire(timeout=timeout):
                raise OperationalError("database is locked (another thread of this process kept writing)")
            self._holds_writer = True
        self._began = time.monotonic()
        try:
            self._begin()
        except BaseException:
            self._release_writer(yielding=False)  # it held nothing: nothing to make up for
            raise

    def _begin(self) -> None:
        """BEGIN IMMEDIATE, retried every fraction of a millisecond while another process holds
        the write lock, instead of in SQLite's busy handler (which sleeps 1, 2, 5, 10, 15 ms...:
        a step colliding with the notifier's short writes a few times lost 30 ms)."""
        timeout = float(self.settings_dict["OPTIONS"].get("timeout", 5))
        raw = self.connection
        began = time.monotonic()
        raw.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    raw.execute(f"BEGIN {self.transaction_mode or ''}")  # type: ignore[attr-defined]
                    return
                except sqlite3.OperationalError as exc:
                    waited = time.monotonic() - began
                    if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or waited > timeout:
                        with self.wrap_database_errors:
                            raise
                # Every quarter of a millisecond at first (another process's writes are short),
                # then every 2 ms: a long wait must not spin.
                time.sleep(0.00025 if waited < 0.01 else 0.002)
        finally:
            with contextlib.suppress(sqlite3.Error):  # never in place of what was raised
                raw.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")

    def _release_writer(self, *, yielding: bool = True) -> None:
        if self._holds_writer:
            self._holds_writer = False
            if _polite and yielding:
                held = time.monotonic() - self._began
                time.sleep(min(max(held, 0.0002), MAX_YIELD_SECONDS))
            _writer.release()

    # Overridden (with _rollback): where a transaction ends, the next writer's turn begins.
    def _commit(self) -> Any:
        try:
            return super()._commit()  # type: ignore[misc]
        finally:
            self._release_writer()

    def _rollback(self) -> Any:
        try:
            return super()._rollback()  # type: ignore[misc]
        finally:
            self._release_writer()

    # Overridden: a clean connection goes back to the idle pool instead of being closed.
    def _close(self) -> Any:
        try:
            raw = self.connection
            if (
                raw is not None
                and not self.in_atomic_block
                and not self.errors_occurred
                and not self.is_in_memory_db()
                and _idle.keep(self._idle_key(self.get_connection_params()), self.settings_dict["NAME"], raw)
            ):
                return None
            return super()._close()  # type: ignore[misc]
        finally:
            self._release_writer()
