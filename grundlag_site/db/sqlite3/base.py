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

And its connections are kept for the next thread. Under ASGI each request does its database work
in a thread of its own, and the embedded worker's steps in a pool's threads, so a connection kept
per thread (CONN_MAX_AGE) is never reused: every request and every step opened one, about 2 ms
on this project's schema (SQLite reads the schema again on a new connection's first statement).
A closed connection goes back to a small pool of its process instead, and the next one opened on
the same database file takes it (``_Idle``)."""

from __future__ import annotations

import contextlib
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


class _Idle:
    """Open connections not in use, per database file and options, ready for the next thread.

    A connection is kept only when it is as a new one would be: no transaction open, nothing
    gone wrong on it. It is handed out only in the process that opened it (never across a
    fork) and only while its file is still the one at that path (a test database deleted and
    made again is a new file); otherwise it is closed. At most ``SIZE`` per database: beyond,
    a connection is closed as it was before. None is kept past ``MAX_AGE_SECONDS``: should a
    statement ever be left unfinished on one (a read transaction, which keeps the write-ahead
    log from being started again), it would hold on no longer than that."""

    SIZE = 8
    MAX_AGE_SECONDS = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[Any, ...], list[tuple[sqlite3.Connection, int, tuple[int, int]]]] = {}

    @staticmethod
    def _file(path: str) -> tuple[int, int] | None:
        try:
            stat = os.stat(path)
        except (OSError, ValueError):
            return None
        return stat.st_dev, stat.st_ino

    def take(self, key: tuple[Any, ...], path: str) -> sqlite3.Connection | None:
        file = self._file(path)
        while True:
            with self._lock:
                kept = self._kept.get(key)
                if not kept:
                    return None
                raw, pid, opened_on = kept.pop()
            if pid == os.getpid() and opened_on == file:
                return raw
            if pid == os.getpid():  # another file by now: closed; a forked parent's: left alone
                with contextlib.suppress(sqlite3.Error):
                    raw.close()

    def keep(self, key: tuple[Any, ...], path: str, raw: sqlite3.Connection) -> bool:
        file = self._file(path)
        born = getattr(raw, "born", None)
        if file is None or born is None or time.monotonic() - born > self.MAX_AGE_SECONDS:
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
            kept.append((raw, os.getpid(), file))
        return True


_idle = _Idle()


class _Connection(sqlite3.Connection):
    """A connection that knows when it was opened (``_Idle`` keeps none past its age)."""

    born: float


def yield_to_others() -> None:
    """This process's writes come after other processes' (see the module)."""
    global _polite
    _polite = True


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False
    _began = 0.0

    def _idle_key(self, conn_params: dict[str, Any]) -> tuple[Any, ...]:
        # What a new connection is opened with, and what is run on it as it opens.
        return (repr(sorted(conn_params.items())), self.settings_dict["OPTIONS"].get("init_command", ""))

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        path = str(conn_params["database"])
        if not self.is_in_memory_db() and (raw := _idle.take(self._idle_key(conn_params), path)):
            return raw
        raw = super().get_new_connection({**conn_params, "factory": _Connection})
        raw.born = time.monotonic()
        return raw

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
