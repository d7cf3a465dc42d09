"""Celery tasks. They take ids, never objects, and every one is safe to run twice."""

from __future__ import annotations

from celery import shared_task

from actions import engine


@shared_task(name="actions.tasks.run_step")
def run_step(run_id: int, queued_at: float | None = None) -> None:
    """``queued_at``: when the message was sent (epoch seconds), for the queue-wait figure.
    Optional, so messages sent by an earlier version still run."""
    engine.execute_step(run_id, queued_at)


@shared_task(name="actions.tasks.sweep")
def sweep() -> int:
    return engine.sweep()


@shared_task(name="actions.tasks.apply_policies")
def apply_policies() -> int:
    return engine.apply_policies()
