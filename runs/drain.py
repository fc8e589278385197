"""The outbox drained in batches, with coalesced wake-ups (DESIGN section 6; issue 12 point 2).

A task that registers a batch handler (`register_batch`) is not published as one Celery message
per outbox row. When such a row commits with no countdown, `wake()` publishes one
`runs.drain_outbox` message — only if no wake-up is already on its way (a flag in the broker's
Redis, SET NX with a short TTL) — and the drainer it starts leases the due rows in batches
(`FOR UPDATE SKIP LOCKED`) and hands each task's rows to its handler, until none is left. The
invariants stay those of runs/outbox.py: a row is written in the transaction of its cause, its
handler marks it done in its own first transaction, and the beat sweeper republishes undone
rows (one message each, as before) as the safety net.

What is still published one message per row, as before:
- rows with a countdown (a retry after backoff, a reconciliation after the consistency
  window): Celery's countdown keeps them off the workers until their time;
- tasks with no batch handler (verify, reconcile, webhooks, notifications, and
  `toolcalls.dispatch_approved`, which a person waits on from the `interactive` queue): each is
  slow or rare, and one message each keeps its own time limit, redelivery and a worker of its
  own, where a drainer would run them one behind another;
- everything in the embedded default (memory broker, SQLite, in-process worker): there is no
  Redis for the flag and publishing to the memory broker costs next to nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from config import telemetry
from runs import logcontext
from runs.models import OutboxMessage

log = logging.getLogger(__name__)

WAKE_TASK = "runs.drain_outbox"
# In the broker's Redis database, next to the queues it guards.
WAKE_FLAG = "countersign:outbox:wake"

# (the task's args, the outbox row's id) of each row of one task in a lease.
Items = list[tuple[list[Any], str]]
BatchHandler = Callable[[Items], None]
# A leased row: id, task, args, traceparent.
Leased = tuple[str, str, list[Any], str | None]

_handlers: dict[str, BatchHandler] = {}


def register_batch(task: str, handler: BatchHandler) -> None:
    """Drain `task`'s rows in batches through `handler` instead of one message each. The
    handler marks each row done (outbox.mark_done) in the first transaction of its work, as the
    task would; a row it leaves undone comes back when its lease ends."""
    _handlers[task] = handler


def unregister_batch(task: str) -> None:
    _handlers.pop(task, None)


def coalesces(task: str, countdown: float) -> bool:
    """Whether a row of `task` is left to a drainer instead of being published on its own."""
    return task in _handlers and countdown <= 0 and not settings.EMBEDDED


@cache
def _flag_client() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def wake() -> bool:
    """Publish one drain message unless one is already on its way. Called after the commit of
    a coalesced row; True if this call published.

    The race, and why no row is stranded: a producer commits its row, then tries SET NX. If
    the flag is already set, a wake-up was published (or is being published) whose drainer
    has not yet started — the drainer deletes the flag *before* its first lease — so that
    drainer's first lease runs after this row committed and sees it. If the drainer had
    already deleted the flag, this SET succeeds and publishes a wake-up of its own: a row
    committed during a drain, even after its last lease, gets a drainer. The TTL bounds what a
    lost wake-up costs (a message lost with a Redis restart): once the flag expires, the next
    row or the beat sweeper's `wake_if_due` wakes a drainer again."""
    from config.celery_app import app

    if settings.EMBEDDED:
        return False  # no Redis for the flag: each row is published on its own there
    client = _flag_client()
    try:
        if not _set_flag_if_unset():
            return False  # a wake-up is on its way and its drainer has not started yet
        with telemetry.outside_any_trace():
            app.send_task(WAKE_TASK)
    except Exception:
        # Redis is down or slow: the rows stay undone, the sweeper wakes a drainer (or
        # republishes them) later. Drop the flag if we can, so the next row tries again.
        log.warning("outbox: waking a drainer failed; the sweeper will", exc_info=True)
        with contextlib.suppress(Exception):  # if not, the flag's TTL ends it
            client.delete(WAKE_FLAG)
        return False
    return True


_kept = threading.local()


def _set_flag_if_unset() -> bool:
    """`SET WAKE_FLAG 1 NX EX ttl`; True if it set the flag. Every proposal's commit sends it:
    through the client's pool (a pool check-out, a readiness poll of the socket, the
    command packed anew) it cost 100 µs of CPU, on a connection this thread keeps with the
    command packed once 20 µs. A connection Redis closed (a restart) is replaced once, as the
    client's own retry would; any other failure is the caller's."""
    packed = _packed_set(settings.OUTBOX_WAKE_TTL_SECONDS)
    for attempt in (1, 2):
        conn = _kept_connection()
        try:
            conn.send_packed_command(packed, check_health=False)
            return conn.read_response() is not None
        except redis.ConnectionError:
            _kept.connection = None
            conn.disconnect()
            if attempt == 2:
                raise
        except BaseException:
            _kept.connection = None  # its state is unknown: the next call connects afresh
            conn.disconnect()
            raise
    raise AssertionError("unreachable")


def _kept_connection() -> redis.Connection:
    # One per thread (a connection is not shared between threads) and per process: a child
    # forked from this process makes its own rather than write to its parent's socket.
    conn, pid = getattr(_kept, "connection", None), getattr(_kept, "pid", None)
    if conn is None or pid != os.getpid():
        conn = _flag_client().connection_pool.make_connection()
        _kept.connection, _kept.pid = conn, os.getpid()
    return conn


@cache
def _packed_set(ttl: int) -> list[bytes]:
    return redis.Connection().pack_command("SET", WAKE_FLAG, "1", "NX", "EX", ttl)


def wake_if_due() -> bool:
    """The sweeper's call: wake a drainer if a batched row is due and undone (a lease that
    ended with its drainer dead, a wake-up lost). True if it published one."""
    if not _handlers or settings.EMBEDDED:
        return False
    due = OutboxMessage.objects.filter(
        done_at=None, available_at__lte=timezone.now(), task__in=list(_handlers)
    ).exists()
    return due and wake()


# The lease reads the partial index with a plain index scan, not the bitmap scan (or, on a
# small table, the sequential scan) the planner picks for the few rows it expects: the index
# keeps an entry for every row done since the last vacuum, and only an index scan marks those
# dead as it passes them, so the next lease skips them. With the bitmap scan each lease
# visited them all again (~290 buffers per lease, ~900 rows fetched per call: bench_dispatch).
PLAIN_INDEX_SCAN = (
    "SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)"
)


def lease(limit: int, tasks: list[str] | None = None) -> list[Leased]:
    """Take up to `limit` due, undone rows of the batched tasks in one statement: (id, task,
    args, traceparent) each. Their `available_at` moves forward by OUTBOX_DRAIN_LEASE_SECONDS,
    so no other drainer takes them meanwhile, and a dead drainer's rows come back then. SKIP
    LOCKED: two drainers at once take different rows instead of waiting on each other; a row
    leased and committed meanwhile fails the re-checked `available_at <= now`.

    SQLite has no row locks or SKIP LOCKED (its writers take the database's one write lock in
    turn), so the clause is left out there; the statement is otherwise the same."""
    tasks = list(_handlers) if tasks is None else tasks
    if not tasks or limit <= 0:
        return []
    now = timezone.now()
    until = now + timedelta(seconds=settings.OUTBOX_DRAIN_LEASE_SECONDS)
    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    skip_locked = ""
    if connection.features.has_select_for_update_skip_locked:
        skip_locked = " FOR UPDATE SKIP LOCKED"
    in_tasks = ", ".join(["%s"] * len(tasks))
    sql = (
        f"UPDATE {table} SET available_at = %s WHERE id IN ("
        f"SELECT id FROM {table} WHERE done_at IS NULL AND available_at <= %s"
        f" AND task IN ({in_tasks}) ORDER BY available_at LIMIT %s{skip_locked})"
        " RETURNING id, task, args, traceparent"
    )
    adapt = connection.ops.adapt_datetimefield_value
    # Not inside a caller's transaction: SET LOCAL would outlive this statement there.
    plain_scan = connection.vendor == "postgresql" and not connection.in_atomic_block
    with transaction.atomic(), connection.cursor() as cursor:
        if plain_scan:
            cursor.execute(PLAIN_INDEX_SCAN)
        cursor.execute(sql, [adapt(until), adapt(now), *tasks, limit])
        rows = cursor.fetchall()
    # Django reads JSON columns as text and decodes them itself; so does this.
    return [
        (pk, task, json.loads(args) if isinstance(args, str) else args, traceparent)
        for pk, task, args, traceparent in rows
    ]


def outbox_drain(limit: int | None = None) -> int:
    """Lease and hand over batches until nothing is due (or OUTBOX_DRAIN_MAX_SECONDS passed:
    then a fresh drainer is woken to go on). Returns how many rows were handed over.

    The drainer holds the wake-up flag while it works (at 0.22 wake-ups per call, drainers that
    cleared it first split a steady arrival into batches of 4.5: bench_dispatch). A row
    committed meanwhile wakes nobody: its producer finds the flag set, and this drainer's next
    lease takes it with whatever else came during the batch before — the batch grows with the
    arrival rate. Only a full lease wakes a peer to drain beside this one (another worker
    process), so a backlog still gets every worker. Why no row is stranded: see `_next_lease`."""
    limit = limit or settings.OUTBOX_DRAIN_BATCH
    _hold_flag()
    deadline = time.monotonic() + settings.OUTBOX_DRAIN_MAX_SECONDS
    handled = 0
    previous: float | None = None  # when the last lease ran: the arrival rate's window
    try:
        while True:
            started = time.monotonic()
            rows = _next_lease(limit)
            if not rows:
                return handled  # the flag was released before the last lease
            window = None if previous is None else started - previous
            rows = _fill(rows, limit, window)
            previous = started
            if len(rows) == limit:
                _publish()  # more is likely waiting: a peer drains beside this one
            _hand_over(rows)
            handled += len(rows)
            if time.monotonic() > deadline:
                # Leave the rest to a fresh task: far from the task's time limit, and the
                # queue's other messages get a worker in between.
                break
            _hold_flag()  # its TTL runs from now again
    except BaseException:
        _pass_on()  # rows that found the flag held get a drainer all the same
        raise
    _pass_on()
    return handled


def _next_lease(limit: int) -> list[Leased]:
    """The next lease, with the flag held; when it comes back empty, release the flag and lease
    once more — the drain ends only on a lease made after the flag was released.

    The race, and why no row is stranded: a producer commits its row, then tries SET NX. If it
    finds the flag set, some drainer holds it (a woken one that has not started yet inherits
    it), and every holder releases the flag and then leases before it ends; that lease runs
    after the row committed and sees it. If the SET succeeds, the producer publishes a wake-up
    of its own. A holder that dies is covered by the flag's TTL and the sweeper."""
    rows = lease(limit)
    if rows:
        return rows
    _clear_flag()
    rows = lease(limit)
    if rows:
        _hold_flag()  # going on: rows committed from now wait for this drainer's next lease
    return rows


def _fill(rows: list[Leased], limit: int, window: float | None) -> list[Leased]:
    """A short lease in a stream of rows: wait for enough rows to make a batch of
    OUTBOX_DRAIN_FILL_TARGET, at the rate they came during `window` (the seconds since the
    previous lease), never longer than OUTBOX_DRAIN_FILL_MS; then lease what came meanwhile
    into the same batch. Calls per batch is what a call's CPU in the worker falls with
    (profile_dispatch: ~15 ms alone, ~8.6 in a batch of 10). No wait when not even one more
    row is likely to come in it, and none for a lone row on a drain's first lease: a lone
    call's latency is not spent waiting for company. The flag is held: the rows committed
    during the wait wake nobody."""
    cap = settings.OUTBOX_DRAIN_FILL_MS / 1000
    target = min(limit, settings.OUTBOX_DRAIN_FILL_TARGET)
    if cap <= 0 or len(rows) >= target or settings.EMBEDDED:
        return rows
    if window is None:
        if len(rows) == 1:
            return rows
        wait = cap  # a burst woke this drainer: its rate is not known yet
    else:
        rate = len(rows) / max(window, 1e-6)
        if rate * cap < 1:
            return rows
        wait = min(cap, (target - len(rows)) / rate)
    _wait(wait)
    return rows + lease(limit - len(rows))


def _wait(seconds: float) -> None:
    time.sleep(seconds)


def _hold_flag() -> None:
    """Set the wake-up flag for this drainer (a woken drainer inherits its waker's), with its
    TTL from now: producers that find it set wake nobody."""
    if settings.EMBEDDED:
        return
    try:
        _flag_client().set(WAKE_FLAG, "1", ex=settings.OUTBOX_WAKE_TTL_SECONDS)
    except Exception:
        # Redis is down: producers cannot set the flag either; the sweeper wakes drainers.
        log.warning("outbox: holding the wake-up flag failed", exc_info=True)


def _clear_flag() -> None:
    """Release the flag: rows committed from now on wake another drainer."""
    if settings.EMBEDDED:
        return
    try:
        _flag_client().delete(WAKE_FLAG)
    except Exception:
        # Redis is down: rows committed during this drain may wait for the flag's TTL and the
        # sweeper. The drain itself does not need Redis.
        log.warning("outbox: clearing the wake-up flag failed", exc_info=True)


def _pass_on() -> None:
    """A drain that stops before a lease came back empty (its time is up, or a handler
    raised) releases the flag and wakes a fresh drainer for what the producers that found
    the flag held left behind."""
    _clear_flag()
    wake()


def _publish() -> None:
    """A wake-up regardless of the flag (which this drainer holds): a peer drainer."""
    from config.celery_app import app

    if settings.EMBEDDED:
        return
    try:
        with telemetry.outside_any_trace():
            app.send_task(WAKE_TASK)
    except Exception:
        log.warning("outbox: waking a peer drainer failed", exc_info=True)


def _hand_over(rows: list[Leased]) -> None:
    groups: dict[str, list[Leased]] = {}
    for row in rows:
        groups.setdefault(row[1], []).append(row)
    failed: Exception | None = None
    for task, group in groups.items():
        logcontext.start()  # no ids of an earlier batch on this one's log lines
        items: Items = [(args, pk) for pk, _, args, _ in group]
        try:
            with telemetry.draining(task, [row[3] for row in group]):
                _handlers[task](items)
        except Exception as error:
            # The rows it did not mark done come back when their lease ends; the other
            # tasks' rows of this lease are still handled.
            log.exception("outbox: the batch handler of %s failed on %d rows", task, len(group))
            failed = failed or error
    if len(rows) > 1:
        # The task's closing log line ("succeeded") names no single call of a batch; a batch of
        # one keeps its call's ids there, as a task of its own did.
        logcontext.start()
    if failed is not None:
        # The drain task fails as the task it replaces did (a broken database connection is
        # dropped after it; "raised unexpected" in the worker's log). No row waits on it: a
        # full lease already woke a peer, and rows committed since the flag was cleared woke
        # drainers of their own.
        raise failed
