"""Serve the app with daphne. With the embedded broker (no REDIS_URL) this process is also the
worker: steps run in a pool of its threads the moment they are queued, and a thread does what
Celery beat does in the scaled setup, so one command is the whole installation."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from actions import engine, notify, tracing
from actions.drivers import sandbox
from actions.engine import audit, idempotency, queue, store
from actions.live import waiting
from actions.notify import process

logger = logging.getLogger("actions")

POLICY_EVERY_SECONDS = 15.0


class Command(BaseCommand):
    help = "Serve HTTP and websockets with daphne; with the embedded broker, run the worker too."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="A web process of the scaled setup: never run steps or notifications here "
            "(refused without REDIS_URL, where nothing else would)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: daphne installs Twisted's asyncio reactor as a side effect.
        from daphne.endpoints import build_endpoint_description_strings

        from grundlag_site.asgi import application

        embedded = settings.CELERY_BROKER_URL.startswith("memory://")
        if options["no_worker"] and embedded:
            # Several web processes, each its own worker without a broker, would each re-queue
            # the steps the others are running (sweep(all_unfinished=True) below).
            raise CommandError(
                "--no-worker needs REDIS_URL: it is the scaled setup's web process, and without a "
                "broker no Celery worker would run the steps. Set REDIS_URL, or leave out "
                "--no-worker to run the worker in this process (one process only)."
            )
        stop = threading.Event()
        pool = notifier = None
        if embedded:
            pool = ThreadPoolExecutor(settings.CELERY_WORKER_CONCURRENCY, thread_name_prefix="grundlag-step")
            queue.run_steps_in(pool)
            # Notifications are fanned out and sent by a process of their own (on another
            # core): a big team's mails must not hold up a step, nor a slow endpoint.
            notifier = process.current = process.Notifier()
            notifier.start()
            # This process is the only worker, so a step left running was left by a process
            # that died: re-queue it now instead of waiting for its lease to run out.
            recovered = engine.sweep(all_unfinished=True)
            if recovered:
                logger.info("re-queued %s run(s) left unfinished by the last process", recovered)
            threading.Thread(target=sweep_periodically, args=(stop,), daemon=True).start()

        host, port = options["host"], options["port"]
        # Said once, at start, as the server itself finds it (GRUNDLAG_BWRAP in /usr/bin or /bin,
        # able to make its namespaces here); checked again only by a new process.
        try:
            sandbox.check_isolation()
        except sandbox.SandboxUnavailable as exc:
            self.stderr.write(f"Note: {exc}. Everything else works without it.")
        self.stdout.write(f"Grundlag approvals on http://{host}:{port}/  (Ctrl-C stops it)")
        try:
            draining_server()(
                application=application,
                endpoints=build_endpoint_description_strings(host=host, port=port),
                signal_handlers=True,
                action_logger=None,
            ).run()
        finally:
            stop.set()
            if pool is not None:
                # Running steps finish; steps not started, or queued from now on, stay queued in
                # the database, and the next start runs them (sweep(all_unfinished=True)).
                pool.shutdown(wait=True, cancel_futures=True)
            if notifier is not None:
                process.current = None
                notifier.stop()
        leave()


# How long a stopping server lets the HTTP requests in flight finish, then those it cancelled
# wind up, and then the process's threads end, before it exits without them.
DRAIN_SECONDS = 5.0
CANCEL_SECONDS = 2.0
EXIT_SECONDS = 2.0


def draining_server() -> type:
    """daphne's Server, stopping gently: on SIGTERM it stops accepting connections, the
    requests waiting on a run (`Prefer: wait`, MCP) answer at once with the run as it is, and
    every HTTP request in flight has DRAIN_SECONDS to finish; then what is left is cancelled
    (websockets: the browsers reconnect to whichever server is up), waited for CANCEL_SECONDS
    at most."""
    import asyncio

    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import defer

    class DrainingServer(Server):  # type: ignore[misc]
        def listen_success(self, port: Any) -> None:
            self.ports = [*getattr(self, "ports", []), port]
            super().listen_success(port)

        def kill_all_applications(self) -> defer.Deferred[None]:
            # daphne's own reads every connection's application, which one still receiving its
            # request has not got yet, and waits for the cancelled ones without a limit.
            return defer.Deferred.fromFuture(asyncio.ensure_future(self.stop_gently()))

        def running(self, *, websockets: bool) -> list[asyncio.Future[Any]]:
            return [
                app
                for protocol, details in list(self.connections.items())
                if (app := details.get("application_instance")) is not None
                and not app.done()
                and (websockets or not isinstance(protocol, WebSocketProtocol))
            ]

        async def stop_gently(self) -> None:
            for port in getattr(self, "ports", []):
                port.stopListening()  # the proxy sends new requests to the other processes
            waiting.stop_waits()
            deadline = time.monotonic() + DRAIN_SECONDS
            while self.running(websockets=False) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if left := self.running(websockets=True):
                for app in left:
                    app.cancel()
                await asyncio.wait(left, timeout=CANCEL_SECONDS)

    return DrainingServer


def leave() -> None:
    """Let the process exit, without waiting for ever for a request's thread that cannot end.
    Django runs a request's sync middleware in a thread that hands the view back to daphne's
    event loop; cancelled, or with the loop stopped, that thread may wait for ever, and
    Python's exit waits for it: SIGTERM would hang until the supervisor's SIGKILL. What such a
    request committed stays committed (a decision, a started run); its client sees the
    connection close, and a retry with the same Idempotency-Key is answered from it."""

    def cut_off() -> None:
        time.sleep(EXIT_SECONDS)
        logger.warning("requests still in flight %s s after stopping; exiting without them", EXIT_SECONDS)
        tracing.flush()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    # A daemon: it runs while the exit waits for the other threads, and dies with the process
    # when they end in time.
    threading.Thread(target=cut_off, name="grundlag-exit", daemon=True).start()


def sweep_periodically(stop: threading.Event) -> None:
    """What Celery beat does in the scaled setup: recover stuck runs (every
    GRUNDLAG_SWEEP_SECONDS), fire due policies (every POLICY_EVERY_SECONDS)."""
    every = settings.GRUNDLAG_SWEEP_SECONDS
    policies_due = time.monotonic() + POLICY_EVERY_SECONDS
    while not stop.wait(every):
        policies = time.monotonic() >= policies_due
        if policies:
            policies_due = time.monotonic() + POLICY_EVERY_SECONDS
        run_periodic_tick(sweep=True, policies=policies)


def run_periodic_tick(*, sweep: bool, policies: bool = True) -> None:
    """One round of the periodic work, as a request would do it: a connection that died since
    the last round (a restarted PostgreSQL) is dropped first and opened anew, so one failure
    does not stop deadlines and sweeps until the process restarts."""
    close_old_connections()
    try:
        try:
            if policies:
                engine.apply_policies()
                audit.daily()
                idempotency.prune()
            if sweep:
                engine.sweep()
                if (notifier := process.current) is not None:
                    notifier.ping()  # started again, should it have died; it does its own rounds
                else:
                    notify.periodic_round()
        except Exception:
            logger.exception("periodic engine work failed")
        if policies:
            store.refresh_statistics()  # last: it never stops the rest
    finally:
        close_old_connections()
