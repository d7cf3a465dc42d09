"""What every benchmark shares: production settings (DEBUG off records no queries), on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

PRODUCTION_ENV = {
    "DEBUG": "false",
    "SECRET_KEY": "benchmark-only-secret-key-not-for-any-deployment-0123456789",
    # Plain HTTP on 127.0.0.1: cookies must not demand HTTPS here.
    "SECURE_COOKIES": "false",
}


def migrated_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's child process, its database migrated."""
    env = {
        **os.environ,
        **PRODUCTION_ENV,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "grundlag_site.settings",
        **extra,
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True
    )
    return env


def raise_file_limit() -> None:
    """As many open files as the system allows (inherited by the servers it starts): a
    benchmark with 1,000 sockets needs more than the usual 1,024 descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user and system) of these processes and their children, in seconds."""
    return sum(cpu_by_process(pids).values())


def cpu_by_process(pids: list[int]) -> dict[str, float]:
    """CPU time (user and system) of these processes and their children, in seconds, by what
    each is (``manage.py serve``: "serve"; its notifier: "notifier"; a Celery worker of the
    notify queue: "worker -Q notify"; ...), the same kinds added up."""
    import psutil

    totals: dict[str, float] = {}
    for pid in pids:
        process = psutil.Process(pid)
        for p in [process, *process.children(recursive=True)]:
            try:
                times, argv = p.cpu_times(), p.cmdline()
            except psutil.NoSuchProcess:  # a child that ended meanwhile
                continue
            kind = _kind(argv)
            totals[kind] = totals.get(kind, 0.0) + times.user + times.system
    return totals


def _kind(argv: list[str]) -> str:
    managed = [n for n, arg in enumerate(argv[:-1]) if arg.endswith("manage.py")]
    if managed:
        return argv[managed[0] + 1]
    if any(arg.endswith("celery") for arg in argv):
        words = [arg for arg in argv if arg in ("worker", "beat")]
        flags = [n for n, arg in enumerate(argv[:-1]) if arg in ("-Q", "--queues")]
        queue = argv[flags[0] + 1] if flags else ""
        return " ".join([*words, *(["-Q", queue] if queue else [])]) or "celery"
    return " ".join(argv[:2])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def database_for(setup: str, name: str) -> Iterator[tuple[Path, str]]:
    """A scratch folder and a database URL for ``setup``: SQLite in the folder ("embedded"), or a
    PostgreSQL server of the benchmark's own ("scaled"); both removed afterwards."""
    import tempfile

    from tests.integration.services import Postgres

    with tempfile.TemporaryDirectory(prefix="grundlag-bench-") as tmp:
        postgres = Postgres() if setup == "scaled" else None
        try:
            if postgres is not None:
                postgres.init()
                postgres.start()
                yield Path(tmp), postgres.create_database(name)
            else:
                yield Path(tmp), f"sqlite:///{tmp}/{name}.sqlite3"
        finally:
            if postgres is not None:
                postgres.cleanup()


def settle_started(processes: list[subprocess.Popen[bytes]], *, timeout: float = 60.0) -> None:
    """Wait until these processes (and their children) have finished starting: their CPU at
    rest, under 50 ms in each of two half-seconds in a row. A server answers before the rest of
    the site has booted (the embedded server's notifier, about 1 s of CPU; the scaled setup's
    Celery workers, about 3 s), and a benchmark that counts CPU from there would charge that to
    the first cycles it measures (what the start costs is a figure of its own: ``cpu_seconds``
    of the processes once this returns). Raises if one of them exits or the site never rests."""
    pids = [process.pid for process in processes]
    deadline = time.monotonic() + timeout
    quiet, before = 0, cpu_seconds(pids)
    while quiet < 2:
        if (gone := [p.args for p in processes if p.poll() is not None]) or time.monotonic() > deadline:
            raise RuntimeError(
                f"the site did not settle after starting: exited {gone}"
                if gone
                else f"the site did not settle within {timeout:.0f} s (CPU {cpu_seconds(pids):.1f} s so far)"
            )
        time.sleep(0.5)
        now = cpu_seconds(pids)
        quiet, before = (quiet + 1 if now - before < 0.05 else 0), now


@contextmanager
def served_site(
    log_dir: Path, database_url: str, *, scaled: bool, workers: int = 1, **env: str
) -> Iterator[tuple[Any, Any, str]]:
    """The app on ``database_url``, migrated and seeded (the demo team and its API token), served
    as deployed: embedded (``manage.py serve``), or scaled (Redis, one daphne, ``workers`` Celery
    worker processes for the steps and one for notifications), once every process has started
    (``settle_started``). Yields (site, server, token);
    prints the processes' logs if the benchmark fails, and stops everything it started."""
    from tests.integration.processes import Site, base_env
    from tests.integration.services import Redis

    site_env = base_env(database_url, action_modules="actions.examples,bench.actions")
    site_env.update(PRODUCTION_ENV, **env)
    redis = Redis() if scaled else None
    if redis is not None:
        redis.start()
        site_env["REDIS_URL"] = redis.url
    site = Site(env=site_env, log_dir=log_dir, redis=redis)
    try:
        site.manage("migrate", "--noinput", "-v0")
        token = site.manage("seed_demo", "--no-runs").strip().splitlines()[-1].split(": ")[-1]
        if redis is None:
            server = site.serve()
        else:
            server = site.web()
            # As deploy/Procfile runs them: workers for the steps, one for notifications.
            for n in range(workers):
                site.worker(f"bench{n}", concurrency=4, queues="celery")
            site.worker("notify", concurrency=4, queues="notify", nice=10)
        settle_started(site.processes)
        yield site, server, token
    except BaseException:
        print(site.logs()[-6000:])
        raise
    finally:
        site.stop_all()
        if redis is not None:
            redis.stop()
