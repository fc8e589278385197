"""The project's Celery app with proposed settings, for `bench_dispatch --celery-app
bench.celery_tuned`: measures a change before anyone makes it in config/.

CELERY_DB_REUSE_MAX: Celery's Django fixup closes every database connection before and after
each task unless this is set, so each task opens a new PostgreSQL connection (a backend fork,
authentication and `SELECT set_config('TimeZone', ...)`). With it, a connection is closed only
after 2 x N tasks of its worker (Django's CONN_MAX_AGE still applies).
"""

from __future__ import annotations

from config.celery_app import app

app.conf.update(CELERY_DB_REUSE_MAX=1000)

__all__ = ("app",)
