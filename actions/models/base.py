"""What the models share: a JSONField that loads whatever was stored, partial indexes."""

from __future__ import annotations

from typing import Any

from django.db import models

TOO_DEEP = "(too deep to show)"


class JSONField(models.JSONField):
    """Django's JSONField, whose rows load whatever was stored. A value nested too deeply to
    decode (stored before every value was bounded, or by hand) loads as a placeholder, so that
    the pages, lists and admin that show its row still answer."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except RecursionError:
            return TOO_DEEP

    def get_placeholder(self, value: Any, compiler: Any, connection: Any) -> str:
        """The default placeholder, said out loud: a field that has one keeps Django's bulk
        inserts on PostgreSQL as rows of VALUES. Without it each column goes as one array
        (UNNEST), and psycopg quotes every JSON value into the array's literal character by
        character: an event's two notifications cost 0.76 ms of CPU to insert that way, 0.43
        as two rows (bench/RESULTS.md)."""
        return "%s"


def where_set(field: str, name: str) -> models.Index:
    """An index of the rows whose nullable ``field`` is set. Engine writes leave most of these
    foreign keys empty (an event by the engine has no actor), and an index of NULLs is a page
    written by every insert for no query: the ones these serve (a deleted user's rows, an
    escalation's interrupts, a pruned interrupt's events) name a value."""
    return models.Index(fields=[field], name=name, condition=models.Q(**{f"{field}__isnull": False}))
