"""The transactional outbox: the only way work is enqueued (DESIGN section 6)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from runs.models import OutboxMessage

log = logging.getLogger(__name__)


def enqueue(task: str, *args: Any, countdown: float = 0, publish_now: bool = True) -> OutboxMessage:
    """Write a message in the caller's transaction; it is published once that commits.

    With `publish_now=False` the caller does the work itself right after the commit and marks
    the message done; the message is only a safety net that the sweeper publishes if the
    caller died first."""
    if not connection.in_atomic_block:
        raise RuntimeError("outbox messages are written in the transaction of their cause")
    message = OutboxMessage.objects.create(
        task=task, args=list(args), available_at=timezone.now() + timedelta(seconds=countdown)
    )
    if publish_now:
        transaction.on_commit(lambda: publish(message, countdown=countdown))
    return message


def publish(message: OutboxMessage, countdown: float = 0) -> None:
    from config.celery_app import app

    try:
        app.send_task(
            message.task,
            args=message.args,
            kwargs={"outbox_id": message.pk},
            countdown=countdown or None,
        )
    except Exception:
        # The broker is down or slow: the row stays undone and the sweeper publishes it later.
        log.warning(
            "outbox: publishing %s failed; the sweeper will retry", message.pk, exc_info=True
        )


def mark_done(outbox_id: str | None) -> None:
    """Called by a task in its first transaction. Done twice is harmless."""
    if outbox_id:
        OutboxMessage.objects.filter(pk=outbox_id, done_at=None).update(done_at=timezone.now())


def republish_due(limit: int = 500) -> int:
    """Publish again the messages nobody took in time. Returns how many."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.OUTBOX_REPUBLISH_AFTER_SECONDS)
    due = list(
        OutboxMessage.objects.filter(done_at=None, available_at__lt=cutoff).order_by(
            "available_at"
        )[:limit]
    )
    published = 0
    for message in due:
        # Claim the republish with a conditional update: two sweepers never both send it.
        claimed = OutboxMessage.objects.filter(
            pk=message.pk, done_at=None, available_at=message.available_at
        ).update(available_at=now, published_count=F("published_count") + 1)
        if claimed == 1:
            publish(message)
            published += 1
    return published
