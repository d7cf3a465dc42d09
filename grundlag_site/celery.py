from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "grundlag_site.settings")

app = Celery("grundlag_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def serve_metrics(**kwargs: object) -> None:
    from actions.metrics import serve_worker_metrics

    serve_worker_metrics()
