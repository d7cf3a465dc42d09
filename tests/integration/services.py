"""Real PostgreSQL and Redis servers for the tests, from Debian's packages, on private ports.

PostgreSQL refuses to run as root, so as root its commands run as the `postgres` user that the
Debian package creates."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import redis

from tests.integration.processes import free_port, stop, wait_for, wait_for_port


def postgres_installed() -> bool:
    return bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
    return found[-1]


class Postgres:
    user = "grundlag"

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="grundlag-pg-"))
        self.data = self.base / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            self.base.chmod(0o755)
            shutil.chown(self.base, "postgres", "postgres")

    def _as_owner(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def init(self) -> None:
        subprocess.run(
            self._as_owner(
                _postgres_bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                self.user,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        log = open(self.base / "postgres.log", "ab")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            self._as_owner(
                _postgres_bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.base),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, self.proc)
        wait_for(self._accepts_connections, 30, "postgres to accept connections")

    def _accepts_connections(self) -> bool:
        with psycopg.connect(self.url("postgres")):
            return True

    def stop(self) -> None:
        if self.proc is None:
            return
        # `runuser` does not pass signals on: ask PostgreSQL itself for a fast shutdown
        # (open transactions are aborted, then it exits).
        subprocess.run(
            self._as_owner(_postgres_bin("pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w"),
            check=False,
            capture_output=True,
        )
        stop(self.proc)
        self.proc = None

    def url(self, database: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> str:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


class Redis:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if not shutil.which("redis-server"):
            raise RuntimeError("Redis is not installed: apt-get install redis-server (.ci/run does)")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--maxclients",
                "4000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    def flush(self) -> None:
        redis.Redis.from_url(self.url).flushall()
