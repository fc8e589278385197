"""Runs due outbox messages in the test's own thread: the tasks a Celery worker would run,
without the broker, so that a test can put faults and crashes between precise steps."""

from __future__ import annotations

import time

from django.utils import timezone

from config.celery_app import app
from runs.models import OutboxMessage

# A worker imports every app's tasks module at start; so does this one.
app.loader.import_default_modules()


def run_due(max_rounds: int = 50) -> int:
    """Run every message that is due now, and those they enqueue; returns how many ran."""
    ran = 0
    for _ in range(max_rounds):
        due = list(
            OutboxMessage.objects.filter(done_at=None, available_at__lte=timezone.now()).order_by(
                "available_at", "id"
            )
        )
        if not due:
            return ran
        for message in due:
            # Calling a task object runs its body here, as a worker would.
            app.tasks[message.task](*message.args, outbox_id=message.pk)
            ran += 1
    raise AssertionError("the outbox never drained: a loop of messages?")


def run_until(condition, timeout: float = 20.0) -> None:
    """Keep running due messages (waiting for countdowns) until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run_due()
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")
