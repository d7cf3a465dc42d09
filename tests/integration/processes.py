"""Start the real thing for integration tests: `manage.py serve`, daphne, Celery workers,
Redis and PostgreSQL, as separate processes on 127.0.0.1 ports of their own."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}" + (f": {last!r}" if last else ""))


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30) -> None:
    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout, f"port {port}")


@dataclass
class Site:
    """The app's environment: which database, which Redis; commands and processes share it."""

    env: dict[str, str]
    log_dir: Path
    token: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # The servers behind a scaled site, for tests that stop and restart them.
    postgres: Any = None
    redis: Any = None

    def manage(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read the site's database directly, as an auditor of the outcome would."""
        url = self.env["DATABASE_URL"]
        if url.startswith("sqlite:///"):
            import sqlite3

            with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
                return db.execute(query.replace("%s", "?"), params).fetchall()
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute(query, params).fetchall()

    def event_kinds(self, run_id: int) -> list[str]:
        rows = self.sql("SELECT kind FROM actions_runevent WHERE run_id = %s ORDER BY id", run_id)
        return [kind for (kind,) in rows]

    def effects(self, key: str) -> int:
        return int(self.sql("SELECT COUNT(*) FROM test_side_effects WHERE effect_key = %s", key)[0][0])

    def spawn(self, name: str, *argv: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc

    def serve(self, port: int | None = None) -> Server:
        """`manage.py serve`: daphne, plus the embedded worker when there is no REDIS_URL."""
        port = port or free_port()
        proc = self.spawn(f"serve-{port}", sys.executable, "manage.py", "serve", "--port", str(port))
        wait_for_port(port, proc)
        return Server(proc, port)

    def web(self, port: int | None = None) -> Server:
        """A web process of the scaled setup, as deploy/Procfile runs it: `manage.py serve
        --no-worker` (daphne, and no worker of its own)."""
        port = port or free_port()
        proc = self.spawn(
            f"web-{port}", sys.executable, "manage.py", "serve", "--no-worker", "--port", str(port)
        )
        wait_for_port(port, proc)
        return Server(proc, port)

    def worker(
        self,
        name: str = "w1",
        concurrency: int = 2,
        queues: str = "",
        nice: int = 0,
        wait_ready: bool = False,
    ) -> subprocess.Popen[bytes]:
        """A Celery worker; ``queues`` (-Q): "celery" for steps, "notify" for notifications,
        both when not given; ``nice``: as deploy/Procfile runs the notifications' worker;
        ``wait_ready``: return once it consumes, for a test that times what follows (a worker
        takes a few seconds to start on a busy machine)."""
        log = self.log_dir / f"worker-{name}.log"
        ready_line = re.compile(rf"\b{re.escape(name)}@\S+ ready\.")  # Celery's "w1@host ready."

        def readies() -> int:
            return len(ready_line.findall(log.read_text(errors="replace"))) if log.exists() else 0

        before = readies()
        proc = self.spawn(
            f"worker-{name}",
            *(["nice", "-n", str(nice)] if nice else []),
            sys.executable,
            "-m",
            "celery",
            "-A",
            "grundlag_site",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
            *(["--queues", queues] if queues else []),
        )
        if wait_ready:
            # A worker that exits is not waited for: its exit ends the wait (and is raised).
            wait_for(lambda: proc.poll() is not None or readies() > before, what=f"worker {name} ready")
            if proc.poll() is not None:
                raise RuntimeError(f"worker {name} exited with {proc.returncode}; see {log}")
        return proc

    def beat(self) -> subprocess.Popen[bytes]:
        """Celery beat: the periodic sweeps and policy timers of the scaled setup."""
        return self.spawn(
            "beat",
            sys.executable,
            "-m",
            "celery",
            "-A",
            "grundlag_site",
            "beat",
            "--schedule",
            str(self.log_dir / "celerybeat-schedule"),
            "--loglevel",
            "INFO",
        )

    def stop_all(self) -> None:
        for proc in self.processes:
            stop(proc)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=40)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def base_env(database_url: str, action_modules: str = "actions.examples") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "PYTEST"))}
    env.update(
        DATABASE_URL=database_url,
        GRUNDLAG_ACTION_MODULES=action_modules,
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="grundlag_site.settings",
        # The tests' clients speak plain HTTP to 127.0.0.1, as `make run` serves it.
        SECURE_COOKIES="false",
    )
    return env


def logged_in_reviewer(web: Server) -> httpx.Client:
    """An HTTP client logged in as reviewer1 through the login form, as a browser would be."""
    reviewer = httpx.Client(base_url=web.url, timeout=30)
    reviewer.get("/login/")
    response = reviewer.post(
        "/login/",
        data={
            "username": "reviewer1",
            "password": "reviewer1-demo",
            "csrfmiddlewaretoken": reviewer.cookies["csrftoken"],
        },
        headers={"Referer": f"{web.url}/login/"},
    )
    assert response.status_code == 302, "login failed"
    return reviewer


def decide(
    web: Server, interrupt_id: int, *, approve: bool = True, fields: dict[str, str] | None = None
) -> None:
    """reviewer1 decides the interrupt on its page, as a browser would: approves it with the
    answer form's ``fields``, or rejects it ("not this week")."""
    reviewer = logged_in_reviewer(web)
    try:
        page = reviewer.get(f"/interrupts/{interrupt_id}/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, f"no form on the page of interrupt {interrupt_id}"
        form = {"csrfmiddlewaretoken": token.group(1)}
        headers = {"Referer": f"{web.url}/interrupts/{interrupt_id}/"}
        if approve:
            response = reviewer.post(
                f"/interrupts/{interrupt_id}/approve/", data={**form, **(fields or {})}, headers=headers
            )
        else:
            form["reject-reason"] = "not this week"
            response = reviewer.post(f"/interrupts/{interrupt_id}/reject/", data=form, headers=headers)
        assert response.status_code in (200, 302), response.text[:500]
    finally:
        reviewer.close()


def decide_when_asked(
    web: Server, *, approve: bool, fields: dict[str, str] | None = None
) -> threading.Thread:
    """reviewer1 waits for the next approval to reach the inbox, then decides it on its page."""

    def decide_next() -> None:
        reviewer = logged_in_reviewer(web)
        try:
            for _ in range(200):
                found = re.search(r'href="/interrupts/(\d+)/"', reviewer.get("/").text)
                if found:
                    break
                threading.Event().wait(0.05)
        finally:
            reviewer.close()
        assert found, "no approval reached the inbox"
        decide(web, int(found.group(1)), approve=approve, fields=fields)

    thread = threading.Thread(target=decide_next, daemon=True)
    thread.start()
    return thread


@dataclass
class OidcProvider:
    """A real OpenID Connect provider (django-oauth-toolkit, tests/integration/oidc_provider),
    served by Django's runserver on a port of its own; the site is registered as its client."""

    directory: Path
    port: int = field(default_factory=free_port)
    client_id: str = "grundlag-site"
    client_secret: str = "grundlag-site-secret-for-tests-0123456789"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}/o"

    def env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "PYTEST", "GRUNDLAG_"))
        }
        env.update(
            DJANGO_SETTINGS_MODULE="tests.integration.oidc_provider.settings",
            OIDC_PROVIDER_DB=str(self.directory / "provider.sqlite3"),
            OIDC_PROVIDER_KEY=str(self.directory / "provider-key.pem"),
            OIDC_PROVIDER_ISSUER=self.issuer,
            PYTHONUNBUFFERED="1",
        )
        return env

    def django(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "django", *args], cwd=ROOT, env=self.env(), capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"provider: django {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def start(self, site_url: str, *users: str) -> None:
        """Its key, database, client and ``users`` (``name:group,group``), then the server."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.directory / "provider-key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        self.site_url = site_url
        self.django("migrate", "--noinput", "-v0")
        self.set_users(*users)
        log = open(self.directory / "provider.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, self.proc)

    def set_users(self, *users: str) -> None:
        """Register the site, and make (or regroup) ``users``: ``name:group,group``."""
        self.django(
            "provider_setup",
            "--client-id",
            self.client_id,
            "--client-secret",
            self.client_secret,
            "--site",
            self.site_url,
            *users,
        )

    def site_env(self, **more: str) -> dict[str, str]:
        """What the site is configured with to sign in with this provider."""
        return {
            "GRUNDLAG_OIDC_ISSUER": self.issuer,
            "GRUNDLAG_OIDC_CLIENT_ID": self.client_id,
            "GRUNDLAG_OIDC_CLIENT_SECRET": self.client_secret,
            "GRUNDLAG_OIDC_NAME": "Test IdP",
            **more,
        }

    def logs(self) -> str:
        path = self.directory / "provider.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
