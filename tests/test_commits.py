"""tests/commits.py: in a test that rolls back, after-commit work runs as deployed."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from tests import commits

pytestmark = pytest.mark.django_db


def test_django_still_marks_the_tests_own_blocks() -> None:
    """What the emulation reads: if a Django release renames these, this fails first."""
    assert getattr(transaction.atomic(), "_from_testcase", None) is False
    blocks = connection.atomic_blocks
    assert blocks and all(getattr(block, "_from_testcase", None) is True for block in blocks)
    assert commits.only_tests_blocks(connection) and not commits.in_codes_transaction(connection)


def test_callbacks_run_when_the_codes_outermost_block_commits_and_not_before() -> None:
    ran: list[str] = []
    transaction.on_commit(lambda: ran.append("outside"))
    assert ran == ["outside"], "no transaction of the code's: at once, as in autocommit"
    with transaction.atomic():
        assert commits.in_codes_transaction(connection)
        transaction.on_commit(lambda: ran.append("outer"))
        with transaction.atomic():
            transaction.on_commit(lambda: ran.append("inner"))
        assert ran == ["outside"], "a savepoint released is no commit"
    assert ran == ["outside", "outer", "inner"]


def test_callbacks_of_what_rolls_back_never_run() -> None:
    ran: list[str] = []
    with transaction.atomic():
        transaction.on_commit(lambda: ran.append("kept"))
        try:
            with transaction.atomic():
                transaction.on_commit(lambda: ran.append("rolled back"))
                raise RuntimeError
        except RuntimeError:
            pass
    assert ran == ["kept"]
    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(lambda: ran.append("failed"))
        raise RuntimeError
    assert ran == ["kept"]


def test_a_callback_that_asks_for_another_runs_it_too_and_robust_ones_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []

    def fails() -> None:
        raise ValueError("boom")

    with transaction.atomic():
        transaction.on_commit(lambda: transaction.on_commit(lambda: ran.append("then")))
        transaction.on_commit(fails, robust=True)
        transaction.on_commit(lambda: ran.append("after the failure"))
    assert ran == ["then", "after the failure"]
    assert "boom" in caplog.text
