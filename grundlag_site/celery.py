from __future__ import annotations

import gc
import os

from celery import Celery
from celery.signals import worker_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "grundlag_site.settings")

app = Celery("grundlag_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def run_tasks_where_sent(on: bool = True) -> bool:
    """Celery runs each task in the process that sends it (tests, benchmarks), or not; what it
    did before. Set by its prefixed name: with a namespace, Celery 5.6 ignores
    ``conf.task_always_eager = ...`` (and reads the prefixed one under either name)."""
    before = bool(app.conf.task_always_eager)
    app.conf.CELERY_TASK_ALWAYS_EAGER = on
    return before


@worker_init.connect
def serve_metrics(**kwargs: object) -> None:
    from actions.metrics import serve_worker_metrics

    serve_worker_metrics()


@worker_ready.connect
def freeze_startup(**kwargs: object) -> None:
    """As in grundlag_site.asgi: what the worker loaded lives as long as it does, out of the
    collector's sight (a full collection would walk it all again, every step stopped)."""
    gc.collect()
    gc.freeze()
