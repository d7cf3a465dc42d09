from __future__ import annotations

import gc
import os

from celery import Celery
from celery.signals import worker_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "grundlag_site.settings")

app = Celery("grundlag_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


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
