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
  server's writers get their turn however many mails it is sending."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

_writer = threading.Lock()

_polite = False
MAX_YIELD_SECONDS = 0.05


def yield_to_others() -> None:
    """This process's writes come after other processes' (see the module)."""
    global _polite
    _polite = True


class DatabaseWrapper(base.DatabaseWrapper):
    _holds_writer = False
    _began = 0.0

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
            return super()._close()  # type: ignore[misc]
        finally:
            self._release_writer()
