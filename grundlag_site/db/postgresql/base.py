"""Django's PostgreSQL backend, whose statements a connection repeats are prepared.

With ``server_side_binding`` (settings.POSTGRESQL_STATEMENT_OPTIONS) values travel as
parameters, so a statement's text is the same whatever its values, and psycopg prepares one a
connection has run ``prepare_threshold`` times: PostgreSQL then executes it without parsing it
again (nor planning it, where one plan serves any values; bench/RESULTS.md). The one thing
server-side binding cannot do is a statement of more than 65,535 values (the protocol counts
them in 16 bits): a large ``bulk_create`` or a long ``__in`` list. Such a statement has its
values written into its text instead, as Django's default (client-side binding) does for every
statement."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.postgresql import base

# The most values one statement can carry as parameters (the Bind message counts them in 16 bits).
MAX_PARAMETERS = 65535


class BoundCursor(base.ServerBindingCursor):
    def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
        if params is not None and len(params) > MAX_PARAMETERS:
            # Merged here as a client-side cursor merges them, with this connection's adapters;
            # a text with its values in it is not worth preparing.
            query = psycopg.ClientCursor(self.connection).mogrify(query, params)  # type: ignore[attr-defined]
            return super().execute(query, None, **{**options, "prepare": False})  # type: ignore[misc]
        return super().execute(query, params, **options)  # type: ignore[misc]


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        if params.get("cursor_factory") is base.ServerBindingCursor:
            params["cursor_factory"] = BoundCursor
        return params
