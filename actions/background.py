"""One seam for work done in the background: ``submit`` a Celery task (actions.tasks) by its
name. Scaled, it goes to the workers, by the queue its route names (CELERY_TASK_ROUTES); in the
embedded setup, to the threads this process gave that queue (``threads_for``: the server's for
the steps, its notifier's for the notifications), where it runs as a worker would run it, its
retries included.

The engine and the notifier hand their work on through here by the task's name: the tasks
module calls the engine and the notifier, so they do not import it. The app's ``ready()``
imports actions.tasks, which registers the tasks."""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import close_old_connections

from actions import tracing

logger = logging.getLogger(__name__)

RUN_STEP = "actions.tasks.run_step"
DISPATCH = "actions.tasks.dispatch"
DELIVER_NOTIFICATIONS = "actions.tasks.deliver_notifications"

# A message header: when a step's message was sent (epoch seconds, as text: headers are
# strings), for the queue-wait figure. A header, not an argument, so that workers and senders
# of different versions understand each other.
QUEUED_AT = "grundlag_queued_at"


def send(task: str, *args: Any, headers: dict[str, str] | None = None) -> None:
    """Send the task to the workers (run here at once where tasks run where they are sent:
    tests, benchmarks). Raises what the broker raises."""
    current_app.tasks[task].apply_async(args, headers=headers or {})


def run_here(task: str, *args: Any, headers: dict[str, str] | None = None) -> None:
    """Run the task in this thread as a worker would, its retries included; raises its error."""
    current_app.tasks[task].apply(args, headers=headers or {}, throw=True)


def runs_where_sent() -> bool:
    """Whether tasks run in the process that sends them (tests, benchmarks)."""
    return bool(current_app.conf.task_always_eager)


# The embedded setup's threads, by the Celery queue whose tasks they run.
_threads: dict[str, Executor] = {}


def queue_of(task: str) -> str:
    """The Celery queue the task goes to (its route; the default queue otherwise)."""
    route = settings.CELERY_TASK_ROUTES.get(task, {})
    return str(route.get("queue", settings.CELERY_TASK_DEFAULT_QUEUE))


def threads_for(queue: str, pool: Executor | None) -> None:
    """Run this process's tasks of ``queue`` in ``pool``'s threads (None: send them to Celery).
    Once the pool is shut down, what is submitted is refused (RuntimeError): it stays in the
    database, for the next start or round to hand on."""
    if pool is None:
        _threads.pop(queue, None)
    else:
        _threads[queue] = pool


def runs_in_threads(task: str) -> bool:
    """Whether this process runs the task in threads of its own, not Celery's workers."""
    return queue_of(task) in _threads


def submit(task: str, *args: Any, headers: dict[str, str] | None = None) -> None:
    """Hand the task on: to this process's threads for its queue, or to Celery's workers.
    Raises what the broker raises, or RuntimeError from a pool that is shutting down."""
    pool = _threads.get(queue_of(task))
    if pool is None:
        send(task, *args, headers=headers)
        return
    # In the trace of whatever handed it on (the request that started a run, the decision).
    pool.submit(tracing.carry(_in_a_thread), task, args, headers)


def _in_a_thread(task: str, args: tuple[Any, ...], headers: dict[str, str] | None) -> None:
    close_old_connections()
    try:
        run_here(task, *args, headers=headers)
    except Exception:
        logger.exception("task %s%s failed; the sweeper or the periodic round retries it", task, args)
    finally:
        close_old_connections()
