"""The embedded default: a Celery worker and beat inside this process, on the memory broker.

`manage.py demo` starts them so that one command runs the whole product on a bare machine.
WorkController (not `celery worker`'s Worker) installs no signal handlers, so it can live in a
thread; whoever starts it stops it with `stop()`. Beat runs as a thread too: a separate
process could not reach an in-memory broker.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from celery.beat import EmbeddedService
from celery.worker import WorkController
from django.conf import settings

from config.celery_app import app


@dataclass
class EmbeddedRuntime:
    worker: WorkController
    beat: EmbeddedService
    thread: threading.Thread

    def stop(self) -> None:
        self.beat.stop()
        self.worker.stop(in_sighandler=False)
        self.thread.join(timeout=15)


def start(concurrency: int = 4) -> EmbeddedRuntime:
    if not settings.EMBEDDED:
        raise RuntimeError("the embedded worker runs only on the memory:// broker")
    worker = WorkController(
        app=app,
        hostname="embedded@localhost",
        pool_cls="threads",
        concurrency=concurrency,
        # One process: nobody to synchronise with, no remote control to heartbeat.
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
        loglevel="WARNING",
    )
    thread = threading.Thread(target=worker.start, name="celery-embedded", daemon=True)
    thread.start()
    beat = EmbeddedService(
        app,
        thread=True,
        # Non-persistent schedule: every periodic task here is safe to run again at start.
        scheduler_cls="celery.beat:Scheduler",
    )
    beat.start()
    return EmbeddedRuntime(worker=worker, beat=beat, thread=thread)
