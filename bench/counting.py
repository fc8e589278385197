"""The project's Celery app for benchmark workers, counting the SQL statements they send.

`bench_dispatch` starts its workers with `-A bench.counting`. Every statement that goes
through Django's cursor wrapper is counted in the process; after each task the count is
added to a Redis counter that the benchmark reads at the end, and so is the task's name (how
many Celery messages the workers took, by task). Nothing here runs in the
product: it is imported only by benchmark workers.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from celery.signals import task_postrun
from django.db.backends import utils

from bench import WORKER_STATEMENTS, WORKER_TASKS
from config.celery_app import app

_lock = threading.Lock()
_pending = 0
_execute = utils.CursorWrapper.execute
_executemany = utils.CursorWrapper.executemany


def _count() -> None:
    global _pending
    with _lock:
        _pending += 1


def _counted_execute(self: utils.CursorWrapper, *args: Any, **kwargs: Any) -> Any:
    _count()
    return _execute(self, *args, **kwargs)


def _counted_executemany(self: utils.CursorWrapper, *args: Any, **kwargs: Any) -> Any:
    _count()
    return _executemany(self, *args, **kwargs)


utils.CursorWrapper.execute = _counted_execute
utils.CursorWrapper.executemany = _counted_executemany


@task_postrun.connect
def _flush(sender: Any = None, **_: Any) -> None:
    global _pending
    with _lock:
        counted, _pending = _pending, 0
    pipe = redis.Redis.from_url(app.conf.broker_url).pipeline(transaction=False)
    if counted:
        pipe.incrby(WORKER_STATEMENTS, counted)
    pipe.hincrby(WORKER_TASKS, getattr(sender, "name", "?"), 1)
    pipe.execute()


__all__ = ("app",)
