"""The transactional outbox: the only way work is enqueued (DESIGN section 6)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from config import telemetry
from runs import dbvalues, drain, sql
from runs.models import OutboxMessage

log = logging.getLogger(__name__)


def enqueue(
    task: str, *args: Any, countdown: float = 0, publish_now: bool = True, write: bool = True
) -> OutboxMessage:
    """Write a message in the caller's transaction; it is published once that commits.

    With `publish_now=False` the caller does the work itself right after the commit and marks
    the message done; the message is only a safety net that the sweeper publishes if the
    caller died first. With `write=False` the caller INSERTs the returned message itself, in a
    statement of its own in the same transaction (a new call's INSERT writes its dispatch
    message: toolcalls/sql_propose.py); the commit does what it does for a written one.

    A task with a batch handler (runs/drain.py), due now, is not published on its own: the
    commit wakes a drainer, unless one is already woken."""
    if not connection.in_atomic_block:
        raise RuntimeError("outbox messages are written in the transaction of their cause")
    message = _message(task, list(args), timezone.now() + timedelta(seconds=countdown))
    if write:
        # The INSERT written out (runs/sql.py), as enqueue_many's: every approve POST and
        # claim writes one, and the ORM's compilation of it was most of its cost.
        sql.insert_rows([message])
    if publish_now and drain.coalesces(task, countdown):
        # No message of its own: one wake-up for every row committed before a drainer starts.
        transaction.on_commit(drain.wake)
    elif publish_now:
        transaction.on_commit(lambda: publish(message, countdown=countdown))
    return message


def build(task: str, *args: Any) -> OutboxMessage:
    """A message due now, not yet written: for `enqueue_many`, which writes several at once
    (its id is known before, for the caller to name it)."""
    return _message(task, list(args), timezone.now())


def _message(task: str, args: list[Any], available_at: Any) -> OutboxMessage:
    # OutboxMessage(...) without its constructor's per-field loop (runs/dbvalues.py): a
    # dispatched call writes one or two (its claim's, its verification's).
    traceparent = telemetry.current_traceparent()
    values = {"task": task, "args": args, "available_at": available_at, "traceparent": traceparent}
    return dbvalues.new(OutboxMessage, values)


def enqueue_many(messages: list[OutboxMessage], *, publish_now: bool = True) -> None:
    """`enqueue` of messages made by `build`, in one INSERT (a dispatch batch's verifications).
    What happens on commit is what `enqueue` does for each."""
    if not connection.in_atomic_block:
        raise RuntimeError("outbox messages are written in the transaction of their cause")
    sql.insert_rows(messages)
    if not publish_now:
        return
    coalesced = [message for message in messages if drain.coalesces(message.task, 0)]
    if coalesced:
        transaction.on_commit(drain.wake)  # one wake-up is enough for all of them
    for message in messages:
        if message not in coalesced:
            transaction.on_commit(lambda message=message: publish(message))


def publish(message: OutboxMessage, countdown: float = 0, queue: str | None = None) -> bool:
    """Send the message to the broker (to `queue` instead of its task's route when given);
    False if the broker did not take it."""
    from config.celery_app import app

    try:
        kwargs = {"outbox_id": message.pk}
        with telemetry.publishing(message):
            app.send_task(
                message.task,
                args=message.args,
                kwargs=kwargs,
                # What the worker logs of them: a message's arguments are ids, whose repr is
                # what Celery's saferepr made, at a sixth of a publish's Python calls.
                argsrepr=repr(message.args),
                kwargsrepr=repr(kwargs),
                countdown=countdown or None,
                **({"queue": queue} if queue else {}),
            )
    except Exception:
        # The broker is down or slow: the row stays undone and the sweeper publishes it later.
        log.warning(
            "outbox: publishing %s failed; the sweeper will retry", message.pk, exc_info=True
        )
        return False
    return True


def mark_done(outbox_id: str | None) -> None:
    """Called by a task in its first transaction. Done twice is harmless."""
    if not outbox_id:
        return
    if connection.vendor == "postgresql":  # written out (runs/sql.py): a task's first statement
        sql.outbox_mark_done(outbox_id, timezone.now())
    else:
        OutboxMessage.objects.filter(pk=outbox_id, done_at=None).update(done_at=timezone.now())


def republish_due(limit: int = 500) -> int:
    """Publish again the messages nobody took in time. Returns how many.

    A message whose task fails every time would come back forever; after
    OUTBOX_MAX_REPUBLISHES it stays undone and unsent, logged and listed by `outbox_stuck`."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.OUTBOX_REPUBLISH_AFTER_SECONDS)
    due = list(
        OutboxMessage.objects.filter(
            done_at=None,
            available_at__lt=cutoff,
            published_count__lt=settings.OUTBOX_MAX_REPUBLISHES,
        ).order_by("available_at")[:limit]
    )
    published = 0
    for message in due:
        # Claim the republish with a conditional update: two sweepers never both send it.
        claimed = OutboxMessage.objects.filter(
            pk=message.pk, done_at=None, available_at=message.available_at
        ).update(available_at=now)
        if claimed != 1:
            continue
        if not publish(message, queue=settings.OUTBOX_REPUBLISH_QUEUES.get(message.task)):
            # The broker is down: the others would fail too, each after the client's own
            # connection retries (seconds). And only a publish the broker took counts towards
            # the limit, so an hour without a broker uses up no message's republishes.
            break
        OutboxMessage.objects.filter(pk=message.pk).update(published_count=F("published_count") + 1)
        published += 1
        if message.published_count + 1 >= settings.OUTBOX_MAX_REPUBLISHES:
            log.error(
                "outbox: %s (%s %s) published %d times and never done; it is not published"
                " again. `manage.py outbox_stuck` lists it, --requeue sends it again.",
                message.pk,
                message.task,
                message.args,
                message.published_count + 1,
            )
    return published


def stuck() -> QuerySet[OutboxMessage]:
    """Messages the sweeper gave up on: republished to the limit and still undone."""
    return OutboxMessage.objects.filter(
        done_at=None, published_count__gte=settings.OUTBOX_MAX_REPUBLISHES
    ).order_by("available_at")


def requeue(message_id: str) -> bool | None:
    """Give a stuck message a fresh set of republishes and publish it now. None when no such
    message is stuck; otherwise whether the broker took it (if not, the sweeper sends it)."""
    message = stuck().filter(pk=message_id).first()
    if message is None:
        return None
    OutboxMessage.objects.filter(pk=message.pk).update(
        published_count=0, available_at=timezone.now()
    )
    return publish(message)
