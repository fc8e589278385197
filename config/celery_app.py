from __future__ import annotations

import inspect
import os
from typing import Any

from celery import Celery, signals
from django.conf import settings
from django.db import close_old_connections

from config import gc_freeze, priority, telemetry
from runs import logcontext

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")

app = Celery("countersign")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection around each task unless this is set:
# a new PostgreSQL connection per task cost more CPU than the task itself (bench_dispatch).
# With it set the fixup does nothing between tasks, so the handlers below do what Django does
# around each web request instead.
app.conf.update(CELERY_DB_REUSE_MAX=1000)
app.autodiscover_tasks()


@signals.worker_init.connect
def lower_the_cpu_priority(sender: Any = None, **kwargs: Any) -> None:
    """WORKER_NICE: the bulk worker yields the CPU to the web and `interactive` processes.
    worker_init runs in the main process before the pool starts; on Linux the nice value is
    per thread and inherited, so the pool's threads and forked children run at it too."""
    priority.lower(settings.WORKER_NICE)


@signals.worker_ready.connect
@signals.worker_process_init.connect
def freeze_what_startup_loaded(sender: Any = None, **kwargs: Any) -> None:
    """No full garbage collection walks the worker's modules again (config/gc_freeze.py):
    worker_ready in the main process (the threads pool runs tasks there), worker_process_init
    in each child of the prefork pool."""
    gc_freeze.freeze()


@signals.task_prerun.connect
@signals.task_postrun.connect
def retire_broken_or_old_connections(sender: Any = None, **kwargs: Any) -> None:
    """Close a connection that is broken or older than CONN_MAX_AGE, around every task.

    Without this a worker whose connection the database dropped (a restart, a failover,
    pg_terminate_backend) failed every later task with "the connection is closed". Before a
    task, CONN_HEALTH_CHECKS makes its first query check the kept connection (SELECT 1) and
    open a new one if that fails; after a task that hit a database error, the connection is
    checked and dropped at once. A task run eagerly shares its caller's connection and
    transaction, which must not be closed under it."""
    if sender is not None and getattr(sender.request, "is_eager", False):
        return
    close_old_connections()


@signals.task_prerun.connect
def bind_the_task_ids(sender: Any = None, args: Any = (), kwargs: Any = None, **_: Any) -> None:
    """Each task's log lines and spans start with the ids its arguments name (`tool_call_id`,
    `approval_id`); the services bind more once they load the row. An eager task keeps its
    caller's."""
    if sender is None or getattr(sender.request, "is_eager", False):
        return
    try:
        named = inspect.signature(sender.run).bind_partial(*args, **(kwargs or {})).arguments
    except TypeError:
        named = {}
    logcontext.start(**{name: value for name, value in named.items() if isinstance(value, str)})


@signals.task_postrun.connect
def forget_the_task_ids(sender: Any = None, **kwargs: Any) -> None:
    if sender is not None and not getattr(sender.request, "is_eager", False):
        logcontext.start()


# Tracing starts where tasks run — in each prefork child, after the fork (a span exporter's
# thread does not survive one) — and in beat, which publishes the periodic tasks.
@signals.worker_process_init.connect
def trace_the_worker(**kwargs: Any) -> None:
    telemetry.configure("worker")


@signals.beat_init.connect
def trace_beat(**kwargs: Any) -> None:
    telemetry.configure("beat")
