"""Django's PostgreSQL backend, with two changes to what goes over the wire.

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
(``Connection._start_query``): requirements.in holds psycopg below its next minor release, and
tests/test_store.py fails if the override is no longer called.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg.abc import PQGen
from psycopg.pq import PipelineStatus, TransactionStatus

# The most values one statement can carry as parameters (the Bind message counts them in 16 bits).
MAX_PARAMETERS = 65535

# Whether this libpq has pipelines (14 and later; the binary wheel's has).
PIPELINES = psycopg.Pipeline.is_supported()


class Connection(psycopg.Connection[Any]):
    """psycopg's connection, which can leave the BEGIN it sends in a pipeline for the statement
    after it to take along (``BoundCursor.execute``)."""

    _begin_with_next = False

    def _start_query(self) -> PQGen[None]:
        if not self._begin_with_next:
            yield from super()._start_query()
            return
        # psycopg's own, less the pipeline's sync (and wait) right after the BEGIN.
        if self.autocommit or self.pgconn.transaction_status != TransactionStatus.IDLE:
            return
        yield from self._exec_command(self._get_tx_start_command())


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
        conn._begin_with_next = True
        try:
            with conn.pipeline():
                super().execute(query, params, **options)  # type: ignore[misc]
        finally:
            conn._begin_with_next = False
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
