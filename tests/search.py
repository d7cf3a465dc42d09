"""The full-text search's stored documents, as a test sees them: a word planted in an
interrupt's document stays until a trigger writes the document again, so a test can tell
whether one did."""

from __future__ import annotations

from django.db import connection


def plant(interrupt_id: int, word: str = "Planted") -> None:
    """Make the interrupt's stored document ``word`` alone (on either database)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "UPDATE actions_interrupt_search SET document = to_tsvector('simple', %s)"
                " WHERE interrupt_id = %s",
                [word, interrupt_id],
            )
        else:
            cursor.execute(
                "UPDATE actions_interrupt_search SET document = %s WHERE rowid = %s", [word, interrupt_id]
            )


def planted(word: str = "Planted") -> set[int]:
    """The interrupts whose document holds ``word``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT interrupt_id FROM actions_interrupt_search"
                " WHERE document @@ to_tsquery('simple', %s)",
                [word],
            )
        else:
            cursor.execute(
                "SELECT rowid FROM actions_interrupt_search WHERE actions_interrupt_search MATCH %s", [word]
            )
        return {pk for (pk,) in cursor.fetchall()}
