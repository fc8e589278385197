"""The project's Celery app for the soak's workers and beat: it delivers some tasks twice.

`manage.py soak` starts its processes with `-A bench.soak_app`. While the file named by
SOAK_DUPLICATE_FLAG exists, a worker about to run a task sends the same message again (same
task, same arguments, same outbox id) with probability SOAK_DUPLICATE_RATE, as a broker that
redelivers would; the copy usually runs at once on another worker, so the two race. A copy
is never copied again. Nothing here runs in the product: only soak processes import it.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

from celery.signals import task_prerun

from config.celery_app import app

log = logging.getLogger("soak")
COPY_SUFFIX = "-again"


@task_prerun.connect
def _deliver_twice(task_id: str | None = None, task: Any = None, **kwargs: Any) -> None:
    flag = os.environ.get("SOAK_DUPLICATE_FLAG", "")
    rate = float(os.environ.get("SOAK_DUPLICATE_RATE", "0"))
    if not (flag and task_id and task is not None) or task_id.endswith(COPY_SUFFIX):
        return
    if random.random() >= rate or not os.path.exists(flag):
        return
    try:
        app.send_task(
            task.name,
            args=kwargs.get("args") or (),
            kwargs=kwargs.get("kwargs") or {},
            task_id=task_id + COPY_SUFFIX,
        )
    except Exception:  # the broker is down (a fault of its own): this copy is not sent
        log.warning("soak: could not deliver %s %s again", task.name, task_id)
        return
    log.warning("soak: delivered %s %s again", task.name, task_id)


__all__ = ("app",)
