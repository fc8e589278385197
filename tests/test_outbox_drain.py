"""The outbox drained in batches (runs/drain.py): one wake-up per burst, leases that two
drainers never share and that come back when a drainer dies, no row stranded by the wake-up
flag, and a lone call dispatched end to end by a real worker through the drainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from runs import drain, outbox
from runs.models import OutboxMessage
from tests.celery_processes import flush_broker
from tests.helpers import ROOT, propose, tool_call_of, wait_for
from toolcalls.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)  # wake-ups happen after the commit

TASK = "tests.drained"


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def queued_tasks() -> list[str]:
    """The task names of the messages waiting in the default queue, oldest first."""
    raw = reversed(broker().lrange("celery", 0, -1))  # LPUSH: the newest is first
    return [json.loads(message)["headers"]["task"] for message in raw]


class Handled:
    """A batch handler that records what it was given and marks each row done, as a task's
    first transaction does."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[list, str]]] = []
        self.then = lambda: None

    def __call__(self, items: list[tuple[list, str]]) -> None:
        self.batches.append(items)
        for _, outbox_id in items:
            outbox.mark_done(outbox_id)
        self.then()

    @property
    def args(self) -> list[str]:
        return [args[0] for batch in self.batches for args, _ in batch]


@pytest.fixture
def handled() -> Iterator[Handled]:
    flush_broker()
    handler = Handled()
    drain.register_batch(TASK, handler)
    yield handler
    drain.unregister_batch(TASK)
    flush_broker()


def enqueue(*args: str, countdown: float = 0) -> OutboxMessage:
    with transaction.atomic():
        return outbox.enqueue(TASK, *args, countdown=countdown)


@override_settings(OUTBOX_WAKE_TTL_SECONDS=60)  # however slow the machine, one wake-up
def test_a_burst_of_messages_is_one_wake_up_and_one_drain_handles_them_all(handled) -> None:
    messages = [enqueue(f"m{n}") for n in range(30)]  # 30 commits, one after another

    assert queued_tasks() == [drain.WAKE_TASK]
    assert drain.outbox_drain(limit=8) == 30
    assert sorted(handled.args) == sorted(f"m{n}" for n in range(30))
    assert [len(batch) for batch in handled.batches] == [8, 8, 8, 6]
    assert not OutboxMessage.objects.filter(pk__in=[m.pk for m in messages], done_at=None).exists()


def test_messages_with_a_countdown_and_tasks_without_a_handler_keep_their_own_message(
    handled,
) -> None:
    enqueue("later", countdown=30)
    with transaction.atomic():
        outbox.enqueue("tests.unbatched", "x")
    with transaction.atomic():
        outbox.enqueue("toolcalls.dispatch_approved", "tc_clicked")
    assert queued_tasks() == [TASK, "tests.unbatched"]
    assert [json.loads(m)["headers"]["task"] for m in broker().lrange("interactive", 0, -1)] == [
        "toolcalls.dispatch_approved"
    ]
    assert drain.outbox_drain() == 0  # the countdown's row is not due


def test_two_drainers_at_once_never_lease_the_same_row(handled) -> None:
    with transaction.atomic():
        ids = {outbox.enqueue(TASK, f"m{n}", publish_now=False).pk for n in range(300)}
    start = threading.Barrier(2)
    leased: list[list[str]] = [[], []]

    def drainer(slot: int) -> None:
        start.wait()
        try:  # each thread has a connection of its own
            while rows := drain.lease(7, tasks=[TASK]):
                leased[slot] += [pk for pk, *_ in rows]
        finally:
            connection.close()

    threads = [threading.Thread(target=drainer, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert leased[0] and leased[1], "both drainers took part"
    assert not set(leased[0]) & set(leased[1])
    assert sorted(leased[0] + leased[1]) == sorted(ids)  # each row exactly once


@override_settings(OUTBOX_DRAIN_LEASE_SECONDS=0.5)
def test_a_dead_drainers_rows_come_back_when_its_lease_ends(handled) -> None:
    for n in range(5):
        enqueue(f"m{n}")
    # A drainer leased them and died before handling any: nothing is marked done.
    assert len(drain.lease(10)) == 5
    assert drain.outbox_drain() == 0  # still leased
    time.sleep(0.6)

    assert drain.outbox_drain() == 5
    assert sorted(handled.args) == [f"m{n}" for n in range(5)]
    assert not OutboxMessage.objects.filter(task=TASK, done_at=None).exists()
    # And the beat sweeper wakes a drainer for such rows on its own.
    enqueue("m5")
    drain.lease(10)
    flush_broker()
    time.sleep(0.6)
    assert drain.wake_if_due()
    assert queued_tasks() == [drain.WAKE_TASK]


def test_a_message_committed_during_a_drain_is_that_drains_and_wakes_nobody(handled) -> None:
    enqueue("first")
    assert queued_tasks() == [drain.WAKE_TASK]
    # While the drainer handles "first", a request commits "during": after the drainer's
    # lease, so that lease did not see it.
    handled.then = lambda: enqueue("during") if handled.args == ["first"] else None

    assert drain.outbox_drain() == 2

    # The drainer held the flag while it worked: "during" woke nobody, and the same drain's
    # next lease took it.
    assert queued_tasks() == [drain.WAKE_TASK]
    assert handled.args == ["first", "during"]
    # The drain released the flag before it ended: a row after it wakes a drainer, as ever.
    enqueue("after")
    assert queued_tasks() == [drain.WAKE_TASK, drain.WAKE_TASK]
    assert drain.outbox_drain() == 1


def test_a_row_committed_just_before_the_drainer_releases_the_flag_is_not_stranded(
    handled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrowest window: the drainer's lease came back empty, and a row commits while the
    flag is still held (its producer wakes nobody); the drainer leases once more after it
    released the flag, and that lease takes the row."""
    enqueue("first")
    clear = drain._clear_flag
    arrived: list[str] = []

    def row_then_clear() -> None:
        if not arrived:
            arrived.append(enqueue("late").pk)  # finds the flag held: no wake-up
        clear()

    monkeypatch.setattr(drain, "_clear_flag", row_then_clear)

    assert drain.outbox_drain() == 2

    assert queued_tasks() == [drain.WAKE_TASK]  # "late" woke nobody...
    assert handled.args == ["first", "late"]  # ...and was handed over all the same
    assert not OutboxMessage.objects.filter(task=TASK, done_at=None).exists()


def test_a_drain_whose_handler_raises_releases_the_flag_and_wakes_a_fresh_drainer(
    handled,
) -> None:
    enqueue("first")
    flush_broker()

    def fail() -> None:
        enqueue("during")  # finds the flag held: counts on this drainer
        raise RuntimeError("the handler broke")

    handled.then = fail

    with pytest.raises(RuntimeError):
        drain.outbox_drain()

    # "during" is not left to the sweeper: the failing drain woke a fresh drainer for it.
    assert queued_tasks() == [drain.WAKE_TASK]
    handled.then = lambda: None
    assert drain.outbox_drain() == 1
    assert handled.args == ["first", "during"]


def test_a_full_lease_wakes_a_peer_though_the_drainer_holds_the_flag(handled) -> None:
    for n in range(5):
        enqueue(f"m{n}")
    flush_broker()

    assert drain.outbox_drain(limit=3) == 5

    assert queued_tasks() == [drain.WAKE_TASK]  # the full lease's peer
    assert [len(batch) for batch in handled.batches] == [3, 2]


@override_settings(OUTBOX_DRAIN_FILL_MS=40, OUTBOX_DRAIN_FILL_TARGET=10)
def test_the_fill_wait_follows_the_arrival_rate_and_is_capped(
    handled, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[float] = []
    monkeypatch.setattr(drain, "_wait", waited.append)
    rows = [("id", TASK, [], None)] * 4

    drain._fill(rows, 20, 0.012)  # 4 rows in 12 ms: 6 more take 18 ms
    drain._fill(rows, 20, 0.02)  # 4 rows in 20 ms: 6 more would take 30 ms
    drain._fill(rows[:1], 20, 0.004)  # a row every 4 ms: 9 more would take 36 ms
    drain._fill(rows, 20, 0.5)  # 4 rows in 500 ms: not one more is likely in 40 ms
    drain._fill(rows, 20, None)  # a burst woke the drain: no rate yet, the whole wait
    drain._fill(rows[:1], 20, None)  # a lone row on a drain's first lease
    drain._fill(rows * 3, 20, 0.001)  # the target is reached

    assert waited == pytest.approx([0.018, 0.03, 0.036, 0.04])


def test_a_burst_arriving_during_a_short_lease_fills_the_batch_without_waking_another(
    handled, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue("m0")
    enqueue("m1")  # found the flag set: no wake-up of its own
    waited: list[float] = []

    def arriving(seconds: float) -> None:
        """Three more commits while the drainer waits."""
        waited.append(seconds)
        for n in range(2, 5):
            enqueue(f"m{n}")

    monkeypatch.setattr(drain, "_wait", arriving)

    assert drain.outbox_drain(limit=8) == 5

    assert waited == [settings.OUTBOX_DRAIN_FILL_MS / 1000]
    assert [sorted(args[0] for args, _ in batch) for batch in handled.batches] == [
        ["m0", "m1", "m2", "m3", "m4"]
    ]
    # The drainer held the flag while it waited: the three commits woke no other drainer.
    assert queued_tasks() == [drain.WAKE_TASK]
    assert not OutboxMessage.objects.filter(task=TASK, done_at=None).exists()
    # And a row committed after the drain wakes one, as ever: the flag was cleared.
    enqueue("after")
    assert queued_tasks() == [drain.WAKE_TASK, drain.WAKE_TASK]


def test_a_lone_row_is_handed_over_without_waiting(
    handled, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue("alone")
    monkeypatch.setattr(drain, "_wait", lambda seconds: pytest.fail("a lone row waited"))

    assert drain.outbox_drain(limit=8) == 1
    assert handled.args == ["alone"]


@pytest.mark.slow
def test_a_lone_call_is_dispatched_end_to_end_by_a_worker_through_the_drainer(
    agent, sandbox, start_celery
) -> None:
    worker = start_celery("worker")
    call = tool_call_of(propose(agent))
    wait_for(
        lambda: ToolCall.objects.get(pk=call.pk).verification_status == "confirmed_success",
        40,
        "the call to settle",
    )
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    # One wake-up message ran the dispatch; no `toolcalls.dispatch` message was sent.
    assert f"Task {drain.WAKE_TASK}[" in worker.output()
    assert "Task toolcalls.dispatch[" not in worker.output()
    assert not OutboxMessage.objects.filter(done_at=None, task="toolcalls.dispatch").exists()


def test_the_drainer_works_on_sqlite_where_the_embedded_default_runs(tmp_path) -> None:
    """The embedded default publishes each row as before (no Redis for the flag), but the
    drainer's lease statement runs on SQLite too: it has no SKIP LOCKED, and needs none."""
    script = """
import django, json
django.setup()
from django.core.management import call_command
from django.db import transaction
from runs import drain, outbox
call_command("migrate", verbosity=0)
seen = []
drain.register_batch("tests.drained", lambda items: [
    (seen.append(args[0]), outbox.mark_done(pk)) for args, pk in items])
with transaction.atomic():
    for n in range(5):
        outbox.enqueue("tests.drained", f"m{n}", publish_now=False)
print(json.dumps({"coalesces": drain.coalesces("tests.drained", 0),
                  "handled": drain.outbox_drain(limit=2), "seen": seen}))
"""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL"}
    }
    env.update(DJANGO_SETTINGS_MODULE="config.settings.base", COUNTERSIGN_VAR_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["coalesces"], result["handled"]) == (False, 5)
    assert sorted(result["seen"]) == ["m0", "m1", "m2", "m3", "m4"]


def test_the_lease_reads_the_pending_index_with_a_plain_index_scan(handled) -> None:
    """Only an index scan marks the partial index's entries of done rows dead as it passes
    them; the bitmap scan the planner prefers visited them all again on every lease."""
    with transaction.atomic():
        for n in range(50):
            outbox.mark_done(outbox.enqueue(TASK, f"m{n}", publish_now=False).pk)
    enqueue("due")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_outboxmessage")

    with CaptureQueriesContext(connection) as queries:
        assert [args for _, _, args, _ in drain.lease(5, tasks=[TASK])] == [["due"]]

    begin, setting, statement, commit = [query["sql"] for query in queries.captured_queries]
    assert (begin, commit) == ("BEGIN", "COMMIT")  # the setting ends with the lease
    assert setting == drain.PLAIN_INDEX_SCAN
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(setting)
        cursor.execute(f"EXPLAIN {statement}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using outbox_pending_idx" in plan, plan
    assert "Bitmap" not in plan, plan
    assert "Seq Scan" not in plan, plan
    # Inside a caller's transaction the setting would outlive the lease: it is left out.
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        drain.lease(5, tasks=[TASK])
    assert drain.PLAIN_INDEX_SCAN not in [query["sql"] for query in queries.captured_queries]


def test_a_wake_up_after_redis_closed_the_kept_connection_still_wakes_a_drainer(
    handled,
) -> None:
    """The flag is set on a connection each thread keeps (drain._set_flag_if_unset); one that
    Redis closed meanwhile (a restart, an idle timeout) is replaced, and the wake-up goes."""
    enqueue("first")
    assert drain.outbox_drain() == 1
    kept = drain._kept_connection()
    kept.send_command("CLIENT", "ID")
    broker().client_kill_filter(_id=kept.read_response())
    flush_broker()

    enqueue("second")

    assert queued_tasks() == [drain.WAKE_TASK]
    assert drain._kept_connection() is not kept
    assert drain.outbox_drain() == 1 and handled.args == ["first", "second"]


def test_a_forked_process_does_not_write_to_its_parents_kept_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = drain._kept_connection()
    assert drain._kept_connection() is kept
    monkeypatch.setattr(drain, "os", SimpleNamespace(getpid=lambda: os.getpid() + 1))

    assert drain._kept_connection() is not kept
