"""One seam for work done in the background: a Celery task (actions.tasks), named, sent to the
workers or run in this thread as a worker runs it (its retries included).

The engine and the notifier hand their work on through here by the task's name: the tasks
module calls the engine and the notifier, so they do not import it. The app's ``ready()``
imports actions.tasks, which registers the tasks."""

from __future__ import annotations

from typing import Any

from celery import current_app

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
