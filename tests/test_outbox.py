"""The outbox sweeper: it republishes messages nobody finished, up to a limit, and a person can
list the ones it gave up on and send them again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import outbox
from runs.models import OutboxMessage
from tests.helpers import redis_down, wait_for

# A task no worker knows: published to the broker, never done.
TASK = "tests.never_done"


def queued(message: OutboxMessage) -> int:
    """How many copies of the message the broker holds in the default queue."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    return sum(message.pk.encode() in raw for raw in client.lrange("celery", 0, -1))


@pytest.fixture
def message(db: None) -> Iterator[OutboxMessage]:
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("celery")
    with transaction.atomic():
        message = outbox.enqueue(TASK, "x", publish_now=False)
    OutboxMessage.objects.filter(pk=message.pk).update(
        available_at=timezone.now() - timedelta(minutes=5)
    )
    yield message
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("celery")


@override_settings(OUTBOX_REPUBLISH_AFTER_SECONDS=0, OUTBOX_MAX_REPUBLISHES=3)
def test_a_message_never_done_is_republished_up_to_the_limit_then_listed(
    message: OutboxMessage, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="runs.outbox"):
        sent = [outbox.republish_due() for _ in range(5)]
    assert sent == [1, 1, 1, 0, 0]
    message.refresh_from_db()
    assert message.published_count == 3 and message.done_at is None
    assert queued(message) == 3
    assert [r.message for r in caplog.records if message.pk in r.message] == [
        f"outbox: {message.pk} ({TASK} ['x']) published 3 times and never done; it is not "
        "published again. `manage.py outbox_stuck` lists it, --requeue sends it again."
    ]

    out = StringIO()
    call_command("outbox_stuck", stdout=out)
    assert f"{message.pk}  {TASK}  args=['x']  published 3 times" in out.getvalue()
    assert "1 stuck (republished 3 times, never done)" in out.getvalue()

    out = StringIO()
    call_command("outbox_stuck", "--requeue", message.pk, stdout=out)
    assert out.getvalue() == f"Requeued {message.pk}: published again now.\n"
    message.refresh_from_db()
    assert message.published_count == 0
    assert queued(message) == 4
    assert list(outbox.stuck()) == []
    assert outbox.republish_due() == 1  # it has its republishes again


def test_requeue_refuses_a_message_that_is_not_stuck(message: OutboxMessage) -> None:
    with pytest.raises(CommandError, match=f"No stuck outbox message {message.pk}"):
        call_command("outbox_stuck", "--requeue", message.pk, stdout=StringIO())


@override_settings(OUTBOX_REPUBLISH_AFTER_SECONDS=0, OUTBOX_MAX_REPUBLISHES=3)
def test_publishes_the_broker_refused_do_not_count(message: OutboxMessage) -> None:
    with redis_down(settings.CELERY_BROKER_URL):
        assert [outbox.republish_due() for _ in range(2)] == [0, 0]
        message.refresh_from_db()
        assert message.published_count == 0
    # The broker is back: the next sweeps send it (the first may meet a dead pooled connection).
    wait_for(lambda: outbox.republish_due() == 1, 10, "a republish the broker takes")
    message.refresh_from_db()
    assert message.published_count == 1
    assert queued(message) == 1


@override_settings(OUTBOX_REPUBLISH_AFTER_SECONDS=0)
def test_an_approved_calls_dispatch_nobody_took_is_republished_to_the_bulk_queue(db: None) -> None:
    """The Procfile's bulk worker takes only `celery` (it runs at a lower CPU priority): with
    no `interactive` worker to take it, the sweeper hands an approved call to the bulk workers."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("celery", "interactive")
    with transaction.atomic():
        message = outbox.enqueue("toolcalls.dispatch_approved", "tc_x", publish_now=False)
    OutboxMessage.objects.filter(pk=message.pk).update(
        available_at=timezone.now() - timedelta(minutes=5)
    )
    try:
        assert outbox.republish_due() == 1
        assert queued(message) == 1
        assert broker.llen("interactive") == 0
    finally:
        broker.delete("celery", "interactive")


def test_enqueue_writes_the_row_the_orm_writes(db: None) -> None:
    """enqueue's hand-written INSERT (runs/sql.py insert_rows) leaves what `create()` left."""
    with transaction.atomic():
        ours = outbox.enqueue(TASK, "tc_x", 2, countdown=30, publish_now=False)
        theirs = OutboxMessage.objects.create(
            task=TASK, args=["tc_x", 2], available_at=ours.available_at, traceparent=None
        )
    stored = OutboxMessage.objects.get(pk=ours.pk)
    fields = [f.attname for f in OutboxMessage._meta.concrete_fields]
    differ = ("id", "created_at")
    same = [name for name in fields if name not in differ]
    other = OutboxMessage.objects.get(pk=theirs.pk)
    assert [getattr(stored, n) for n in same] == [getattr(other, n) for n in same]
    assert [getattr(stored, n) for n in fields] == [getattr(ours, n) for n in fields]
    assert stored.pk.startswith("obx_") and not ours._state.adding
    assert ours.available_at - stored.created_at >= timedelta(seconds=29)


def test_marking_done_writes_what_the_orms_update_wrote(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mark_done's hand-written UPDATE (runs/sql.py outbox_mark_done) changes what the ORM's
    `filter(pk=..., done_at=None).update(done_at=now)` changed, in one statement; a message
    done already keeps its time."""
    moment = timezone.now().replace(microsecond=123456)
    earlier = moment - timedelta(minutes=1)
    with transaction.atomic():
        ours, theirs, done = (outbox.enqueue(TASK, n, publish_now=False) for n in "abc")
    OutboxMessage.objects.filter(pk=done.pk).update(done_at=earlier)
    before = {m["id"]: m for m in OutboxMessage.objects.values()}
    monkeypatch.setattr(outbox.timezone, "now", lambda: moment)

    with CaptureQueriesContext(connection) as queries:
        outbox.mark_done(ours.pk)
        outbox.mark_done(done.pk)
    OutboxMessage.objects.filter(pk=theirs.pk, done_at=None).update(done_at=moment)

    after = {m["id"]: m for m in OutboxMessage.objects.values()}

    def changed(pk: str) -> dict:
        return {k: v for k, v in after[pk].items() if before[pk][k] != v}

    assert len(queries) == 2
    assert changed(ours.pk) == changed(theirs.pk) == {"done_at": moment}
    assert changed(done.pk) == {}
