"""The SQLite backend's writers (grundlag_site.db.sqlite3): the threads of a process take turns
on a lock of their own, another process's write lock is waited for by retrying, and every way a
transaction ends lets the next one in. Each test has a database file of its own."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError

from grundlag_site.db.sqlite3 import base


def wrapper(path: Path, timeout: float = 5) -> base.DatabaseWrapper:
    """A connection as settings.DATABASES makes it for SQLite, on ``path``."""
    return base.DatabaseWrapper(
        {
            "ENGINE": "grundlag_site.db.sqlite3",
            "NAME": str(path),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": timeout,
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            "TIME_ZONE": None,
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": False,
            "AUTOCOMMIT": True,
            "ATOMIC_REQUESTS": False,
            "USER": "",
            "PASSWORD": "",
            "HOST": "",
            "PORT": "",
            "TEST": {},
        }
    )


@contextmanager
def transaction(connection: base.DatabaseWrapper) -> Iterator[Any]:
    """What transaction.atomic does for an outermost block, on this connection."""
    connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
    try:
        with connection.cursor() as cursor:
            yield cursor
    except BaseException:
        connection.rollback()
        raise
    else:
        connection.commit()
    finally:
        connection.set_autocommit(True)


@pytest.fixture
def database(tmp_path: Path, django_db_blocker: Any) -> Iterator[Path]:
    """A database file of the test's own, which its connections may use (not the site's)."""
    django_db_blocker.unblock()
    path = tmp_path / "writers.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE log (who TEXT, at REAL)")
    try:
        yield path
    finally:
        django_db_blocker.restore()
    assert not base._writer.locked(), "a test left the process's write lock taken"


def in_thread(work: Any) -> threading.Thread:
    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_threads_write_in_turn_each_after_the_last_commits(database: Path) -> None:
    holding, done = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        connection = wrapper(database)
        with transaction(connection) as cursor:
            cursor.execute("INSERT INTO log VALUES ('first', 0)")
            holding.set()
            time.sleep(0.2)
            order.append("first commits")
        connection.close()

    def second() -> None:
        assert holding.wait(10)
        connection = wrapper(database)
        with transaction(connection) as cursor:
            order.append("second begins")
            cursor.execute("INSERT INTO log VALUES ('second', 0)")
        connection.close()
        done.set()

    threads = [in_thread(first), in_thread(second)]
    for thread in threads:
        thread.join(10)
    assert done.is_set()
    assert order == ["first commits", "second begins"]
    with sqlite3.connect(database) as db:
        assert [who for (who,) in db.execute("SELECT who FROM log ORDER BY rowid")] == ["first", "second"]


@pytest.mark.parametrize("ending", ["rollback", "error", "close"])
def test_every_way_a_transaction_ends_lets_the_next_writer_in(database: Path, ending: str) -> None:
    connection = wrapper(database)
    if ending == "close":
        connection.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
        connection.cursor().execute("INSERT INTO log VALUES ('gone', 0)")
        connection.close()
    else:
        with pytest.raises((RuntimeError, OperationalError)), transaction(connection) as cursor:
            cursor.execute("INSERT INTO log VALUES ('undone', 0)")
            if ending == "rollback":
                raise RuntimeError("the block gave up")
            cursor.execute("INSERT INTO nowhere VALUES (1)")  # the database refuses it
        connection.close()
    assert not base._writer.locked()
    written = threading.Event()

    def next_writer() -> None:
        other = wrapper(database, timeout=2)
        with transaction(other) as cursor:
            cursor.execute("INSERT INTO log VALUES ('next', 0)")
        other.close()
        written.set()

    in_thread(next_writer).join(10)
    assert written.is_set()
    with sqlite3.connect(database) as db:
        assert [who for (who,) in db.execute("SELECT who FROM log")] == ["next"]


def test_another_process_holding_the_lock_is_waited_for_then_given_up_on(database: Path) -> None:
    # Another connection stands for another process: SQLite's lock is per connection.
    other = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released_at: list[float] = []

    def release_later() -> None:
        time.sleep(0.3)
        released_at.append(time.monotonic())
        other.execute("COMMIT")

    releaser = in_thread(release_later)
    connection = wrapper(database, timeout=5)
    with transaction(connection) as cursor:
        begun_at = time.monotonic()
        cursor.execute("INSERT INTO log VALUES ('after', 0)")
    releaser.join()
    assert begun_at >= released_at[0], "it began once the other process let go, not before"
    # What the retrying set aside is back: writes outside a transaction still wait in SQLite.
    assert connection.cursor().execute("PRAGMA busy_timeout").fetchone() == (5000,)
    connection.close()

    other.execute("BEGIN IMMEDIATE")
    try:
        impatient = wrapper(database, timeout=0.3)
        started = time.monotonic()
        with pytest.raises(OperationalError, match="locked"), transaction(impatient):
            pass
        assert time.monotonic() - started >= 0.3
        assert not base._writer.locked(), "giving up let go of the process's lock too"
        impatient.close()
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_process_that_yields_leaves_the_database_alone_as_long_as_it_held_it(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "_polite", False)
    base.yield_to_others()
    connection = wrapper(database)
    with transaction(connection) as cursor:
        cursor.execute("INSERT INTO log VALUES ('polite', 0)")
        time.sleep(0.03)
        held_until = time.monotonic()
    assert time.monotonic() - held_until >= 0.025, "the commit returned only after as long again"
    connection.close()


def test_a_process_that_yields_and_could_not_begin_does_not_wait_to_make_up_for_it(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BEGIN that gave up held nothing: the next writer of the process is let in at once (it
    once slept for as long as the machine had been up, holding the process's lock)."""
    monkeypatch.setattr(base, "_polite", False)
    base.yield_to_others()
    other = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    try:
        connection = wrapper(database, timeout=0.2)
        started = time.monotonic()
        with pytest.raises(OperationalError), transaction(connection):
            pass
        assert time.monotonic() - started < 5
        assert not base._writer.locked()
        connection.close()
    finally:
        other.execute("ROLLBACK")
        other.close()


# Connections kept for the next thread (``base._Idle``)


def raw_of(connection: base.DatabaseWrapper) -> Any:
    connection.ensure_connection()
    return connection.connection


def test_a_closed_connection_is_the_next_threads_and_works_as_a_new_one(database: Path) -> None:
    first = wrapper(database)
    with transaction(first) as cursor:
        cursor.execute("INSERT INTO log VALUES ('first', 0)")
    kept = first.connection
    first.close()
    opened: list[Any] = []

    def next_thread() -> None:
        connection = wrapper(database)
        opened.append(raw_of(connection))
        with transaction(connection) as cursor:
            cursor.execute("INSERT INTO log VALUES ('second', 0)")
        assert connection.cursor().execute("PRAGMA foreign_keys").fetchone() == (1,)
        connection.close()

    in_thread(next_thread).join(10)
    assert opened == [kept], "the next thread took the kept connection, not a new one"
    with sqlite3.connect(database) as db:
        assert [who for (who,) in db.execute("SELECT who FROM log ORDER BY rowid")] == ["first", "second"]


def test_a_connection_closed_in_a_transaction_or_after_an_error_is_not_kept(database: Path) -> None:
    in_the_middle = wrapper(database)
    in_the_middle.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)
    in_the_middle.cursor().execute("INSERT INTO log VALUES ('gone', 0)")
    abandoned = in_the_middle.connection
    in_the_middle.close()

    failed = wrapper(database)
    with pytest.raises(OperationalError):
        failed.cursor().execute("SELECT * FROM nowhere")
    broken = failed.connection
    failed.close()

    fresh = raw_of(wrapper(database))
    assert fresh is not abandoned and fresh is not broken
    with pytest.raises(sqlite3.ProgrammingError):
        abandoned.execute("SELECT 1")  # closed, not kept
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT count(*) FROM log").fetchone() == (0,)


def test_a_kept_connection_to_a_file_since_replaced_is_not_handed_out(database: Path) -> None:
    old = wrapper(database)
    old_raw = raw_of(old)
    old.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE other (x INTEGER)")

    connection = wrapper(database)
    assert raw_of(connection) is not old_raw
    assert connection.cursor().execute("SELECT count(*) FROM other").fetchone() == (0,)
    connection.close()
    with pytest.raises(sqlite3.ProgrammingError):
        old_raw.execute("SELECT 1")


def test_kept_connections_do_not_hold_back_checkpoints(database: Path) -> None:
    """A kept connection holds no read transaction, even where a read was left unfinished on it
    (its cursor dropped): the write-ahead log is copied back and started again as often as
    without them, instead of growing with every write. (A cursor still held keeps its read
    open whether its connection is kept or closed: SQLite closes it only once it is let go.)"""
    reader = wrapper(database)
    with transaction(reader) as cursor:
        cursor.executemany("INSERT INTO log VALUES (?, 0)", [("first",), ("second",), ("third",)])
    unfinished = raw_of(reader).cursor()
    unfinished.execute("SELECT who FROM log")
    unfinished.fetchone()  # rows are left to read: a read transaction is open
    del unfinished
    reader.close()
    for n in range(300):
        connection = wrapper(database)
        connection.cursor().execute("PRAGMA wal_autocheckpoint=50")  # pages
        with transaction(connection) as cursor:
            cursor.execute("INSERT INTO log VALUES (?, ?)", ("x" * 8000, n))
        connection.close()
    # 300 writes of two pages and more: 2.4 MB without checkpoints; with them, about 50 pages.
    assert Path(f"{database}-wal").stat().st_size < 100 * 4096


def test_what_a_thread_changed_on_its_connection_is_undone_for_the_next(database: Path) -> None:
    first = wrapper(database, timeout=2)
    raw = raw_of(first)
    raw.execute("PRAGMA foreign_keys = OFF")
    raw.execute("PRAGMA busy_timeout = 0")
    first.close()
    second = wrapper(database, timeout=2)
    assert raw_of(second) is raw
    assert raw.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert raw.execute("PRAGMA busy_timeout").fetchone() == (2000,)
    second.close()


def test_a_forked_child_does_not_use_its_parents_connections(database: Path) -> None:
    parent = wrapper(database)
    kept = raw_of(parent)
    parent.close()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: says whether it was handed the parent's connection
        try:
            child = wrapper(database)
            os.write(write, b"parent's" if raw_of(child) is kept else b"its own")
            child.close()
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 100) == b"its own" and status == 0
    os.close(read)
    again = wrapper(database)
    assert raw_of(again) is kept, "the parent's is still the parent's"
    again.close()


def test_no_connection_is_kept_past_its_age(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = wrapper(database)
    kept = raw_of(first)
    first.close()
    second = wrapper(database)
    assert raw_of(second) is kept
    second.close()
    monkeypatch.setattr(base._Idle, "MAX_AGE_SECONDS", 0.0)  # too old by now: not handed out
    third = wrapper(database)
    assert raw_of(third) is not kept
    third.close()  # nor kept
    with pytest.raises(sqlite3.ProgrammingError):
        kept.execute("SELECT 1")


def test_a_connection_closed_under_django_is_not_kept(database: Path) -> None:
    connection = wrapper(database)
    raw = raw_of(connection)
    raw.close()  # as when the database went away
    connection.close()
    assert raw_of(wrapper(database)) is not raw


# The methods of Django's SQLite backend that grundlag_site/db/sqlite3/base.py overrides (the
# private ones have no stability promise), as Django writes them: a Django release that changes
# one fails here, to be read before the override is trusted again (then update the digest).
DJANGO_METHODS = {
    "_start_transaction_under_autocommit": "7315cfc61c1dde12",
    "_commit": "8ebc361e1e8fcb8d",
    "_rollback": "d671ec3bb3c8ed44",
    "_close": "d1a3f0e9a11cd084",
    "get_new_connection": "99ddcd0012130edd",
}


def test_the_methods_the_backend_overrides_are_still_what_django_wrote() -> None:
    import hashlib
    import inspect

    from django.db.backends.sqlite3 import base as django_sqlite

    from grundlag_site.db.sqlite3 import base as ours

    for name, digest in DJANGO_METHODS.items():
        assert name in vars(ours.DatabaseWrapper), f"{name} is no longer overridden: drop it here"
        theirs = getattr(django_sqlite.DatabaseWrapper, name)
        source = inspect.getsource(theirs)
        assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, (
            f"Django changed DatabaseWrapper.{name}: check grundlag_site/db/sqlite3/base.py against it"
        )


def test_statements_are_converted_to_sqlites_placeholders_as_django_does_once_per_text() -> None:
    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    raw = sqlite3.connect(":memory:")
    ours, djangos = raw.cursor(factory=base._CursorWrapper), raw.cursor(factory=SQLiteCursorWrapper)
    for query in (
        "SELECT 1 FROM t WHERE a = %s AND b = %s",
        "SELECT '100%%' WHERE c LIKE %s ESCAPE '\\'",
        "UPDATE t SET n = n + 1",
        "SELECT %%s, %s",
    ):
        assert ours.convert_query(query) == djangos.convert_query(query), query
    # Named parameters ("pyformat") are Django's own conversion.
    assert ours.convert_query("SELECT %(a)s", param_names=["a"]) == "SELECT :a"
    raw.close()
    base._qmark.cache_clear()
    for _ in range(3):
        base._qmark("SELECT %s")
    assert base._qmark.cache_info().hits == 2
