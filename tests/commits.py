"""Commits as the code sees them, inside a test that rolls back.

Most tests run in a transaction that is rolled back at the end (pytest-django's default, and
fast). There every ``transaction.atomic()`` of the code is a savepoint, so Django keeps each
``transaction.on_commit()`` callback until the end of the test, and then drops it. The engine
does its after-commit work that way (the next step, the notifications, the live pushes), so
without this those tests would see a run that never moves on.

:func:`install` makes a test's transaction invisible to the callbacks, as a deployed process
sees no outer transaction: a callback registered outside the code's own blocks runs at once
(autocommit), and those registered inside run when the code's outermost block exits without
an error (its commit). Callbacks of a savepoint rolled back are dropped by Django as before.
In a test that really commits (``transaction=True``) nothing changes: no test block is open.

This wraps two public methods (``on_commit`` and ``Atomic.__exit__``) and reads two
attributes Django's own TestCase uses for durable blocks (``atomic_blocks``,
``_from_testcase``); tests/test_layout.py checks both, so a Django release that changes
them fails there first.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django.db.backends")
_original_on_commit = BaseDatabaseWrapper.on_commit
_original_exit = transaction.Atomic.__exit__


def only_tests_blocks(connection: BaseDatabaseWrapper) -> bool:
    """Whether every open atomic block is one of the test's own (the code's are all closed)."""
    blocks = connection.atomic_blocks
    return bool(blocks) and all(getattr(block, "_from_testcase", False) for block in blocks)


def in_codes_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the code has a transaction open (one of its atomic blocks), the test's aside."""
    return connection.in_atomic_block and not only_tests_blocks(connection)


def _on_commit(self: BaseDatabaseWrapper, func: Any, robust: bool = False) -> None:
    if not only_tests_blocks(self):
        _original_on_commit(self, func, robust=robust)
    elif not robust:
        func()  # deployed, this connection would be in autocommit: Django runs it at once
    else:
        try:
            func()
        except Exception:
            logger.exception("Error calling %s in on_commit()", getattr(func, "__qualname__", func))


def _exit(self: transaction.Atomic, exc_type: Any, exc_value: Any, traceback: Any) -> None:
    connection = transaction.get_connection(self.using)
    _original_exit(self, exc_type, exc_value, traceback)
    if exc_type is not None or connection.needs_rollback or not only_tests_blocks(connection):
        return
    # The code's outermost block has just "committed": run what it left for after the commit.
    while connection.run_on_commit:
        _, func, robust = connection.run_on_commit.pop(0)
        _on_commit(connection, func, robust=robust)


def install() -> None:
    BaseDatabaseWrapper.on_commit = _on_commit  # type: ignore[method-assign]
    transaction.Atomic.__exit__ = _exit  # type: ignore[method-assign]
