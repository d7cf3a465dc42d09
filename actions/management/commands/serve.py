"""Serve the app with daphne. With the embedded broker (no REDIS_URL) it also runs the
Celery worker, in this process, so one command is the whole installation."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from actions import engine

logger = logging.getLogger("actions")

SWEEP_EVERY_SECONDS = 60.0
POLICY_EVERY_SECONDS = 15.0


class Command(BaseCommand):
    help = "Serve HTTP and websockets with daphne; with the embedded broker, run the worker too."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: daphne installs Twisted's asyncio reactor as a side effect.
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from grundlag_site.asgi import application

        stop = threading.Event()
        worker = None
        if settings.CELERY_BROKER_URL.startswith("memory://"):
            worker = start_embedded_worker()
            # This process is the only worker, so a step left running was left by a process
            # that died: re-queue it now instead of waiting for its lease to run out.
            recovered = engine.sweep(all_unfinished=True)
            if recovered:
                logger.info("re-queued %s run(s) left unfinished by the last process", recovered)
            threading.Thread(target=sweep_periodically, args=(stop,), daemon=True).start()

        host, port = options["host"], options["port"]
        self.stdout.write(f"Grundlag approvals on http://{host}:{port}/  (Ctrl-C stops it)")
        try:
            Server(
                application=application,
                endpoints=build_endpoint_description_strings(host=host, port=port),
                signal_handlers=True,
                action_logger=None,
            ).run()
        finally:
            stop.set()
            if worker is not None:
                worker.stop(in_sighandler=False)


def start_embedded_worker() -> Any:
    from grundlag_site.celery import app

    app.conf.worker_hijack_root_logger = False
    worker = app.Worker(
        pool="threads",
        concurrency=settings.CELERY_WORKER_CONCURRENCY,
        hostname="embedded@%h",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        redirect_stdouts=False,
        loglevel="WARNING",
        quiet=True,
    )
    threading.Thread(target=worker.start, name="celery-worker", daemon=True).start()
    return worker


def sweep_periodically(stop: threading.Event) -> None:
    """What Celery beat does in the scaled setup: recover stuck runs, fire due policies."""
    ticks = 0
    while not stop.wait(POLICY_EVERY_SECONDS):
        ticks += 1
        run_periodic_tick(sweep=ticks % int(SWEEP_EVERY_SECONDS / POLICY_EVERY_SECONDS) == 0)


def run_periodic_tick(*, sweep: bool) -> None:
    """One round of the periodic work, as a request would do it: a connection that died since
    the last round (a restarted PostgreSQL) is dropped first and opened anew, so one failure
    does not stop deadlines and sweeps until the process restarts."""
    close_old_connections()
    try:
        engine.apply_policies()
        if sweep:
            engine.sweep()
    except Exception:
        logger.exception("periodic engine work failed")
    finally:
        close_old_connections()
