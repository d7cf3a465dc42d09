"""Django's PostgreSQL backend, with three changes to what goes over the wire.

**Statements a connection repeats are prepared.** With ``server_side_binding``
(settings.POSTGRESQL_STATEMENT_OPTIONS) values travel as parameters, so a statement's text is
the same whatever its values, and psycopg prepares one a connection has run
``prepare_threshold`` times: PostgreSQL then executes it without parsing it again (nor
planning it, where one plan serves any values; bench/RESULTS.md). The one thing server-side
binding cannot do is a statement of more than 65,535 values (the protocol counts them in 16
bits): a large ``bulk_create`` or a long ``__in`` list. Such a statement has its values written
into its text instead, as Django's default (client-side binding) does for every statement.

**A transaction's BEGIN travels with its first statement.** psycopg starts a transaction by
sending BEGIN and waiting for its answer before it sends the statement: a round trip of its own
for every transaction (4 of the 22 an engine cycle took). Here the two are sent together, in
one pipeline, and answered together. Nothing else changes: the transaction begins where it
did, just before its first statement, and a statement that fails leaves it failed, to be rolled
back as before. Only the first statement of a transaction, when it has values, is sent so; any
other, anything sent while the connection is already in a pipeline, and everything with
``DB_PREPARED_STATEMENTS=false`` (Django's client-side cursor) or a libpq older than 14 (no
pipelines) goes as psycopg sends it. This overrides a private method of psycopg's
(``Connection._start_query``) and calls another (``_exec_command``): requirements.in holds
psycopg below its next minor release, and tests/test_store.py fails if the override is no
longer called.

**A transaction's last statement can travel with its COMMIT.** The engine ends each of its
transactions with one statement whose answer it needs only once the transaction has committed
(the journal: actions.engine.store.append_journal). ``DatabaseWrapper.hold_for_commit`` keeps
such a statement back; the COMMIT takes it along, in one pipeline, and its rows are handed to
the caller once committed, before the transaction's ``on_commit`` callbacks run. A statement
that fails leaves the transaction uncommitted, the error raised from the commit, which Django
meets by rolling back (as it meets a COMMIT that fails). Nothing may run between the held
statement and the commit: another statement, however it is run, is refused
(``HeldStatementError``), and a rollback or a closed connection drops it. The same conditions
as the BEGIN's apply; where they fail, nothing is held and the caller runs the statement at
once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import ProgrammingError
from django.db.backends.postgresql import base
from django.db.backends.utils import debug_transaction
from psycopg.abc import PQGen
from psycopg.pq import PipelineStatus, TransactionStatus

logger = logging.getLogger(__name__)

# The most values one statement can carry as parameters (the Bind message counts them in 16 bits).
MAX_PARAMETERS = 65535

# Whether this libpq has pipelines (14 and later; the binary wheel's has).
PIPELINES = psycopg.Pipeline.is_supported()


class HeldStatementError(ProgrammingError):
    """A statement run after a transaction's last one was held for its COMMIT."""


class Connection(psycopg.Connection[Any]):
    """psycopg's connection, which can leave the BEGIN it sends in a pipeline for the statement
    after it to take along (``BoundCursor.execute``), and hold a transaction's last statement
    for its COMMIT (``DatabaseWrapper.hold_for_commit``)."""

    _begin_with_next = False
    _held: tuple[str, Sequence[Any], Callable[[list[Any]], None]] | None = None

    def _start_query(self) -> PQGen[None]:
        # Every statement starts here, whatever runs it (execute, executemany, copy, stream, a
        # named cursor): none may go before the one held for the COMMIT (cleared as it is sent).
        if self._held is not None:
            raise HeldStatementError(
                "a statement was run after the transaction's last one was held for its COMMIT"
            )
        if not self._begin_with_next:
            yield from super()._start_query()
            return
        # psycopg's own, less the pipeline's sync (and wait) right after the BEGIN.
        if self.autocommit or self.pgconn.transaction_status != TransactionStatus.IDLE:
            return
        yield from self._exec_command(self._get_tx_start_command())

    @contextmanager
    def pipeline_taking_begin(self) -> Iterator[None]:
        """A pipeline whose first statement takes the transaction's BEGIN along, if one is to
        be sent (no sync, and no wait, between them)."""
        self._begin_with_next = True
        try:
            with self.pipeline():
                yield
        finally:
            self._begin_with_next = False

    def forget_held(self) -> None:
        """Drop the statement held for the COMMIT, never sent (a rollback, a close)."""
        self._held = None

    def queue_commit(self) -> None:
        """In a pipeline: queue the transaction's COMMIT, to be answered at the pipeline's sync.
        (psycopg's ``commit()`` syncs the pipeline at once, and its end syncs again: two waits
        where one does.)"""
        with self.lock:
            self.wait(self._exec_command(b"COMMIT"))


class BoundCursor(base.ServerBindingCursor):
    def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
        conn = self.connection  # type: ignore[attr-defined]
        if params is not None and len(params) > MAX_PARAMETERS:
            # Merged here as a client-side cursor merges them, with this connection's adapters;
            # a text with its values in it is not worth preparing.
            query = psycopg.ClientCursor(conn).mogrify(query, params)
            params, options = None, {**options, "prepare": False}
        if (
            # Without values (None or empty) psycopg sends a text by the simple query protocol,
            # which takes several statements in one text; a pipeline has no such protocol.
            not params
            or not isinstance(conn, Connection)
            or conn.autocommit
            or conn.pgconn.transaction_status != TransactionStatus.IDLE
            or conn.pgconn.pipeline_status != PipelineStatus.OFF
        ):
            return super().execute(query, params, **options)  # type: ignore[misc]
        # The transaction's first statement: its BEGIN and it in one round trip.
        with conn.pipeline_taking_begin():
            super().execute(query, params, **options)  # type: ignore[misc]
        return self


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        if params.get("cursor_factory") is base.ServerBindingCursor:
            params["cursor_factory"] = BoundCursor
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        # Made by psycopg.connect, or by the pool, as a psycopg.Connection: the subclass only
        # adds behaviour, so the connection becomes one in place.
        if type(connection) is psycopg.Connection and PIPELINES:
            connection.__class__ = Connection
        return connection

    def hold_for_commit(self, query: str, params: Sequence[Any], then: Callable[[list[Any]], None]) -> bool:
        """Keep ``query`` back, as the last statement of the transaction open on this connection,
        to be sent with its COMMIT in one round trip; ``then`` is called with its rows once the
        transaction has committed, before its ``on_commit`` callbacks. False, holding nothing,
        where it cannot be: no transaction open that a COMMIT ends (autocommit, inside a
        savepoint, or a block that does not commit as it ends), a statement held already, or
        the BEGIN's conditions not met (no pipelines, not the server-binding cursor). The caller
        then runs it now."""
        conn = self.connection
        if not (
            PIPELINES
            and isinstance(conn, Connection)
            and conn._held is None
            and issubclass(conn.cursor_factory, BoundCursor)
            and self.in_atomic_block
            and not self.savepoint_ids  # the outermost atomic block: its end commits
            and self.commit_on_exit
            and not self.needs_rollback
        ):
            return False
        conn._held = (query, params, then)
        return True

    def _commit(self) -> None:
        conn = self.connection
        held = conn._held if isinstance(conn, Connection) else None
        if held is None:
            return super()._commit()  # type: ignore[misc,no-any-return]
        conn._held = None
        query, params, then = held
        # Django's cursor, so that the execute wrappers and the debug log see the statement, but
        # made on this connection as it is: cursor() could check its health and, finding it
        # broken, open another in autocommit, where the statement would commit alone.
        cursor = self._prepare_cursor(self.create_cursor())  # type: ignore[attr-defined]
        with debug_transaction(self, "COMMIT"), self.wrap_database_errors, cursor:
            with conn.pipeline_taking_begin():  # in case it is the transaction's first, too
                cursor.execute(query, params)
                conn.queue_commit()
            # Committed now: reading its rows must not fail (a statement may return none).
            rows = cursor.fetchall() if cursor.description is not None else []
        try:
            then(rows)
        except Exception:
            # Committed: raising now would leave the transaction's on_commit callbacks to run
            # after the next one's. What failed is the caller's, told here.
            logger.exception("the work given the rows of a transaction's last statement failed")
        return None

    def _rollback(self) -> None:
        if isinstance(self.connection, Connection):
            self.connection.forget_held()
        return super()._rollback()  # type: ignore[misc,no-any-return]

    def _close(self) -> None:
        if isinstance(self.connection, Connection):
            self.connection.forget_held()
        return super()._close()  # type: ignore[misc,no-any-return]
