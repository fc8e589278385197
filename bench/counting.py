"""The project's Celery app for benchmark workers, counting the SQL statements they send.

`bench_dispatch` starts its workers with `-A bench.counting`. Every statement that goes
through Django's cursor wrapper is counted in the process; after each task the count is
added to a Redis counter that the benchmark reads at the end, and so is the task's name (how
many Celery messages the workers took, by task), and so are the outbox drainer's batches
(how many rows of each task one hand-over held). Nothing here runs in the
product: it is imported only by benchmark workers.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun
from django.db.backends import utils

from bench import WORKER_DRAINED, WORKER_STATEMENTS, WORKER_TASKS
from config.celery_app import app

_lock = threading.Lock()
_pending = 0
_execute = utils.CursorWrapper.execute
_executemany = utils.CursorWrapper.executemany
_drained: Counter[str] = Counter()


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


@task_prerun.connect
def _count_drained(**_: Any) -> None:
    """Wrap the drainer's hand-over once, at the first task: runs.drain needs Django's apps,
    which are not loaded when Celery imports this module."""
    from runs import drain

    with _lock:  # the pool's threads start their first tasks at once: wrap it once
        if not getattr(drain._hand_over, "counted", False):
            drain._hand_over = _counting(drain._hand_over)


def _counting(hand_over: Any) -> Any:
    def counted(rows: list[Any]) -> None:
        tasks = Counter(task for _, task, _, _ in rows)
        with _lock:
            for task, n in tasks.items():
                _drained[f"{task} batches"] += 1
                _drained[f"{task} rows"] += n
        hand_over(rows)

    counted.counted = True  # type: ignore[attr-defined]
    return counted


utils.CursorWrapper.execute = _counted_execute
utils.CursorWrapper.executemany = _counted_executemany


@task_postrun.connect
def _flush(sender: Any = None, **_: Any) -> None:
    global _pending
    with _lock:
        counted, _pending = _pending, 0
        drained = dict(_drained)
        _drained.clear()
    pipe = redis.Redis.from_url(app.conf.broker_url).pipeline(transaction=False)
    if counted:
        pipe.incrby(WORKER_STATEMENTS, counted)
    pipe.hincrby(WORKER_TASKS, getattr(sender, "name", "?"), 1)
    for key, n in drained.items():
        pipe.hincrby(WORKER_DRAINED, key, n)
    pipe.execute()


__all__ = ("app",)
