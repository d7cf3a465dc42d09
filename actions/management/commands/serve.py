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
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from actions import engine, notify, tracing
from actions.drivers import sandbox
from actions.engine import audit, idempotency, queue
from actions.live import waiting
from actions.notify import process

logger = logging.getLogger("actions")

POLICY_EVERY_SECONDS = 15.0


class Command(BaseCommand):
    help = "Serve HTTP and websockets with daphne; with the embedded broker, run the worker too."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: daphne installs Twisted's asyncio reactor as a side effect.
        from daphne.endpoints import build_endpoint_description_strings

        from grundlag_site.asgi import application

        stop = threading.Event()
        pool = notifier = None
        if settings.CELERY_BROKER_URL.startswith("memory://"):
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


# How long a stopping server lets the HTTP requests in flight finish before cancelling them.
DRAIN_SECONDS = 5.0


def draining_server() -> type:
    """daphne's Server, stopping gently: on SIGTERM the requests waiting on a run (`Prefer:
    wait`, MCP) answer at once with the run as it is, and every HTTP request in flight has
    DRAIN_SECONDS to finish, before daphne cancels what is left (websockets: the browsers
    reconnect to whichever server is up)."""
    import asyncio

    from daphne.server import Server
    from daphne.ws_protocol import WebSocketProtocol
    from twisted.internet import defer

    class DrainingServer(Server):  # type: ignore[misc]
        def kill_all_applications(self) -> defer.Deferred[Any]:
            return defer.Deferred.fromFuture(asyncio.ensure_future(self.drain())).addBoth(
                lambda _: super(DrainingServer, self).kill_all_applications()
            )

        async def drain(self) -> None:
            waiting.stop_waits()
            deadline = time.monotonic() + DRAIN_SECONDS
            while time.monotonic() < deadline and any(
                not isinstance(protocol, WebSocketProtocol)
                and "application_instance" in details
                and not details["application_instance"].done()
                for protocol, details in list(self.connections.items())
            ):
                await asyncio.sleep(0.05)

    return DrainingServer


def leave() -> None:
    """End the process once daphne has stopped, without waiting for requests that were in
    flight when it did. Django runs a request's sync middleware in a thread that hands the view
    back to daphne's event loop; with the loop stopped, that thread waits for ever, and Python's
    exit waits for that thread: SIGTERM would hang until the supervisor's SIGKILL. What such a
    request committed stays committed (a decision, a started run); its client sees the
    connection close, and a retry with the same Idempotency-Key is answered from it."""
    stuck = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if not stuck:
        return
    logger.warning("stopped with %s request(s) in flight; their connections were closed", len(stuck))
    tracing.flush()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    finally:
        close_old_connections()
