from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

app = Celery("countersign")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection around each task unless this is set:
# a new PostgreSQL connection per task cost more CPU than the task itself (bench_dispatch).
# Django's CONN_MAX_AGE and health checks still retire old or broken connections.
app.conf.update(CELERY_DB_REUSE_MAX=1000)
app.autodiscover_tasks()
