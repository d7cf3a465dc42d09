"""Celery tasks. They take ids, never objects, and every one is safe to run twice."""

from __future__ import annotations

from celery import shared_task

from actions import runner


@shared_task(name="actions.tasks.run_step")
def run_step(run_id: int) -> None:
    runner.execute_step(run_id)


@shared_task(name="actions.tasks.sweep")
def sweep() -> int:
    return runner.sweep()


@shared_task(name="actions.tasks.apply_policies")
def apply_policies() -> int:
    return runner.apply_policies()
