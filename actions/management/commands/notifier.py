"""The embedded server's notifier (actions.notify.process), started by `manage.py serve`:
reads its lines from standard input until it closes, fans events out and delivers in threads
of its own, and looks at everything every GRUNDLAG_SWEEP_SECONDS."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from actions import notify
from actions.notify import delivery
from actions.notify.dispatch import dispatch_soon

logger = logging.getLogger("actions")

NICENESS = 10


class Command(BaseCommand):
    help = "The embedded server's notifier; `manage.py serve` starts it (not for use on its own)."

    def handle(self, *args: Any, **options: Any) -> None:
        # First thing: until here SIGTERM ends this process at once, with nothing under way (a
        # server stopping sends it, so a notifier still starting up is not waited for). From
        # here the closing of the pipe stops it, gently; SIGTERM, the server's or a
        # supervisor's to the whole group, is ignored.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        if sys.stdin.isatty():
            raise CommandError("`manage.py serve` starts the notifier and feeds it; it is not run by hand")
        # Ctrl-C in a terminal reaches the whole process group: the server stops this process
        # (it closes the pipe) once it has stopped its own work, so that nothing is cut off.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if connection.vendor == "sqlite":
            # Its writes wait for the server's: see the module.
            from grundlag_site.db.sqlite3.base import yield_to_others

            yield_to_others()
        # The server's requests and steps come first: mails can wait a few milliseconds.
        os.nice(NICENESS)
        pool = ThreadPoolExecutor(4, thread_name_prefix="grundlag-notify")
        notify.deliver_in(pool)
        # As in grundlag_site.asgi: a full collection that walked the whole app took 50 ms or
        # more, with this process's write lock held as like as not. Django's system checks, run
        # before handle(), have imported the site (URLs, views, templates) by now, so it is
        # frozen too: without them the notifier took three times the CPU for each approval.
        gc.collect()
        gc.freeze()
        stop = threading.Event()
        rounds = threading.Thread(target=look_at_everything, args=(stop,), name="grundlag-notify-rounds")
        rounds.start()
        try:
            for line in sys.stdin:
                obey(line)
        finally:
            stop.set()
            rounds.join()
            delivery.finish_background()
            notify.deliver_in(None)
            # Deliveries under way finish; those not started stay pending, due, in the
            # database: the next notifier's first round sends them.
            pool.shutdown(wait=True, cancel_futures=True)


def obey(line: str) -> None:
    word, *args = line.split()
    try:
        numbers = [int(arg) for arg in args]
    except ValueError:
        logger.error("notifier: not understood: %r", line)
        return
    if word == "runs":
        dispatch_soon(runs=numbers)
    elif word == "all":
        dispatch_soon()
    elif word == "deliver":
        for notification_id in numbers:
            delivery.schedule(notification_id)
    elif word != "ping":
        logger.error("notifier: not understood: %r", line)


def look_at_everything(stop: threading.Event) -> None:
    """At once (what a notifier before this one left), then every GRUNDLAG_SWEEP_SECONDS."""
    while True:
        close_old_connections()
        try:
            notify.periodic_round()
        except Exception:
            logger.exception("the notifier's periodic round failed")
        close_old_connections()
        if stop.wait(settings.GRUNDLAG_SWEEP_SECONDS):
            return
