"""How the engine's store runs its SQL: statements written as templates whose table and column
names come from the models' ``_meta`` (``{Run}`` is the run's table, ``{Run.status}`` its
column), values adapted by the model fields' own ``get_db_prep_save`` (or, as parameters, the
way DateTimeField and JSONField save them), rows read back through the same converters a
queryset uses and made into model instances by ``Model.from_db`` (columns not selected are
deferred, loaded on first access). The store's statements run through it; the journal and
the steps insert new rows with ``insert`` and pass JSON with ``Json``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.expressions import Col

from actions.models import (
    ApiToken,
    AuditChain,
    Fanout,
    InboxStream,
    Interrupt,
    Policy,
    Preferences,
    Run,
    RunEvent,
    Team,
    TeamChannels,
    Webhook,
)

M = TypeVar("M", bound=models.Model)


@dataclass(frozen=True, slots=True)
class Json:
    """A parameter for a JSON column, adapted the way ``JSONField`` saves it (None is SQL NULL)."""

    value: Any


def adapted(connection: BaseDatabaseWrapper, params: Sequence[Any]) -> list[Any]:
    """Parameters as the backend stores them: datetimes as ``DateTimeField`` saves them (SQLite:
    naive UTC text), ``Json`` as ``JSONField`` does; anything else as it is."""
    ops = connection.ops
    return [
        ops.adapt_datetimefield_value(param)
        if isinstance(param, datetime)
        else (None if param.value is None else ops.adapt_json_value(param.value, None))
        if isinstance(param, Json)
        else param
        for param in params
    ]


# The cursor of the open one_cursor() block.
_shared: ContextVar[CursorWrapper | None] = ContextVar("grundlag_store_cursor", default=None)


@contextmanager
def one_cursor() -> Iterator[None]:
    """The statements of this block run on one cursor. Django's ``cursor()`` costs about as much
    as running a small statement; a transaction of the engine runs several."""
    with default_db().cursor() as cursor:
        token = _shared.set(cursor)
        try:
            yield
        finally:
            _shared.reset(token)


def open_cursor(connection: BaseDatabaseWrapper) -> AbstractContextManager[CursorWrapper]:
    shared = _shared.get()
    return nullcontext(shared) if shared is not None else connection.cursor()


def execute(sql: str, params: Sequence[Any]) -> int:
    """Run one statement; the number of rows it changed."""
    connection = default_db()
    with open_cursor(connection) as cursor:
        cursor.execute(sql, adapted(connection, params))
        return int(cursor.rowcount)


def fetch(model: type[M], sql: str, params: Sequence[Any]) -> list[M]:
    """Instances of ``model`` from a SELECT or an ``UPDATE ... RETURNING`` naming its columns."""
    connection = default_db()
    with open_cursor(connection) as cursor:
        cursor.execute(sql, adapted(connection, params))
        rows = cursor.fetchall()
        columns = tuple(column[0] for column in cursor.description)
    if not rows:
        return []
    return _instances(connection, model, rows, columns, 0)


def fetch_together(models_: Sequence[type[models.Model]], sql: str, params: Sequence[Any]) -> list[list[Any]]:
    """For each row of a SELECT that names every column of each of ``models_`` in turn
    (``columns_of``: a row joined with the rows it names), one instance of each."""
    connection = default_db()
    with open_cursor(connection) as cursor:
        cursor.execute(sql, adapted(connection, params))
        rows = cursor.fetchall()
        columns = tuple(column[0] for column in cursor.description)
    together: list[list[Any]] = [[] for _ in rows]
    offset = 0
    for model in models_:
        named = _column_names(model)
        if columns[offset : offset + len(named)] != named:
            raise ValueError(f"the statement does not name {model.__name__}'s columns in turn: {sql}")
        for row, instance in zip(together, _instances(connection, model, rows, named, offset), strict=True):
            row.append(instance)
        offset += len(named)
    return together


@cache
def _column_names(model: type[models.Model]) -> tuple[str, ...]:
    return tuple(str(field.column) for field in model._meta.concrete_fields)


def columns_of(model: type[models.Model], alias: str) -> str:
    """Every column of the model's, of the table named ``alias`` in the statement, in the
    model's order (``fetch_together`` reads them so)."""
    return ", ".join(f"{alias}.{_quoted_column(field)}" for field in model._meta.concrete_fields)


def _instances(
    connection: BaseDatabaseWrapper, model: type[M], rows: list[Any], columns: tuple[str, ...], offset: int
) -> list[M]:
    # from_db takes the values in the model's field order, whatever order the SQL named them in.
    attnames, converters = _reading(connection, model, columns)
    instances = []
    for row in rows:
        values = []
        for position, col, convert in converters:
            value = row[offset + position]
            for converter in convert:
                value = converter(value, col, connection)
            values.append(value)
        instances.append(model.from_db(DEFAULT_DB_ALIAS, attnames, values))
    return instances


Converter = Callable[[Any, Col, BaseDatabaseWrapper], Any]
Reading = tuple[list[str], list[tuple[int, Col, list[Converter]]]]

# Per database (alias and backend), per model and columns read. Not per connection: under ASGI
# each request has a connection of its own, and the converters looked up again for each cost a
# GET of a run about as much as its SQL.
_readings: dict[tuple[str, str, type[models.Model], tuple[str, ...]], Reading] = {}


def _reading(connection: BaseDatabaseWrapper, model: type[models.Model], columns: tuple[str, ...]) -> Reading:
    """The attnames of the fields ``columns`` names, in the model's order, and for each: its
    position in the row, its column expression, and the converters its value goes through."""
    key = (connection.alias, connection.vendor, model, columns)
    reading = _readings.get(key)
    if reading is None:
        fields = _fields(model, columns)
        reading = _readings[key] = (
            [field.attname for _, field, _ in fields],
            [
                (
                    position,
                    col,
                    [_of_any(connection, c) for c in connection.ops.get_db_converters(col)]
                    + col.get_db_converters(connection),
                )
                for position, _, col in fields
            ],
        )
    return reading


def _of_any(connection: BaseDatabaseWrapper, converter: Converter) -> Converter:
    """A converter of the backend's, a method of this connection's ``ops``, made one of whichever
    connection it is given (every converter is called with the connection that read the value),
    so that a reading kept for the database keeps no connection alive."""
    method = getattr(converter, "__func__", None)
    if method is None or getattr(converter, "__self__", None) is not connection.ops:
        return converter

    def convert(value: Any, expression: Col, reader: BaseDatabaseWrapper) -> Any:
        return method(reader.ops, value, expression, reader)

    return convert


def insert(obj: M, computed: tuple[str, str, Sequence[Any]] | None = None) -> M:
    """Save a new instance (of a model with an auto-incremented primary key) with one
    INSERT ... RETURNING its primary key. Like ``save()``, minus the signals, which no engine
    model has. ``computed`` is (field, SQL, params): that field's value is computed by the
    database as it inserts (an integer, such as the next number in a sequence)."""
    meta, connection = obj._meta, default_db()
    fields = _insert_fields(type(obj))
    values: list[Any] = []
    for field in fields:
        if computed is not None and field.name == computed[0]:
            values.extend(computed[2])
        else:
            values.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
    sql = _insert_sql(type(obj), connection.vendor, computed[:2] if computed is not None else None)
    with open_cursor(connection) as cursor:
        cursor.execute(sql, values)
        pk, *returned = cursor.fetchone()
    setattr(obj, meta.pk.attname, pk)
    if computed is not None:
        setattr(obj, _concrete(type(obj), computed[0]).attname, returned[0])
    obj._state.adding = False
    obj._state.db = DEFAULT_DB_ALIAS
    return obj


@cache
def _fields(
    model: type[models.Model], columns: tuple[str, ...]
) -> list[tuple[int, models.Field[Any, Any], Col]]:
    """For each of the model's fields that ``columns`` names, in the model's order: where it is
    in the row, the field, and the column expression its converters expect. A column the model
    does not know is left out: one a newer migration added, read by ``SELECT *`` in a process
    not yet upgraded (an upgrade migrates first; a misspelt column the database refuses)."""
    return [
        (columns.index(field.column), field, field.get_col(model._meta.db_table))
        for field in model._meta.concrete_fields
        if field.column in columns
    ]


@cache
def _insert_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [field for field in model._meta.concrete_fields if not field.primary_key]


@cache
def _insert_sql(model: type[models.Model], vendor: str, computed: tuple[str, str] | None) -> str:
    """Cached per backend (``vendor``): quoting differs."""
    fields = _insert_fields(model)
    columns = ", ".join(_quoted_column(field) for field in fields)
    placeholders = ", ".join(
        computed[1] if computed is not None and field.name == computed[0] else "%s" for field in fields
    )
    table, returning = default_db().ops.quote_name(model._meta.db_table), _quoted_column(model._meta.pk)
    if computed is not None:
        returning += ", " + _quoted_column(_concrete(model, computed[0]))
    return f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) RETURNING {returning}"


def _concrete(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.concrete, f"{name} is not a column of {model}"
    return field


def _quoted_column(field: models.Field[Any, Any]) -> str:
    assert field.column is not None, f"{field} is not a concrete field"
    return default_db().ops.quote_name(field.column)


def default_db() -> BaseDatabaseWrapper:
    # The engine uses the default database. Looked up once per statement: every attribute read
    # through the ``connection`` proxy is a thread-local lookup, and once per field they added up.
    return connections[DEFAULT_DB_ALIAS]


# Statements. A template names tables and columns by model and field: {Run} is the run's
# table, {Run.status} its status column, quoted for the database in use.


@cache
def _models() -> dict[str, type[models.Model]]:
    """The models a template may name: the engine's, and the people its notifications go to
    (the site's user model, and the teams' memberships as ``TeamMember``), looked up once the
    apps are loaded."""
    named: dict[str, type[models.Model]] = {
        model.__name__: model
        for model in (Run, Interrupt, RunEvent, Policy, InboxStream, AuditChain, Team, ApiToken)
    }
    named.update(Fanout=Fanout, Preferences=Preferences, Webhook=Webhook, TeamChannels=TeamChannels)
    named["User"] = get_user_model()
    named["TeamMember"] = Team.members.through
    return named


class _Names:
    """A model in a statement's template: formatted, its table; an attribute, a column."""

    def __init__(self, model: type[models.Model], quote: Callable[[str], str]) -> None:
        self._model, self._quote = model, quote

    def __format__(self, spec: str) -> str:
        return self._quote(self._model._meta.db_table)

    def __getattr__(self, name: str) -> str:
        if name == "pk":  # the primary key, whatever its name (the site's user model's)
            return _quoted_column(self._model._meta.pk)
        return _quoted_column(_concrete(self._model, name))


@cache
def _statement(template: str, vendor: str) -> str:
    quote = default_db().ops.quote_name
    return template.format_map({name: _Names(model, quote) for name, model in _models().items()})


def sql(template: str) -> str:
    """The statement of a template, for the database in use (cached: formatted once)."""
    return _statement(template, default_db().vendor)
