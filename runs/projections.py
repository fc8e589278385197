"""Rebuild state from the event log and compare it with the stored rows.

A projection names the rows it owns, how each event type changes them, and how to read the
stored rows in the same shape. `verify` replays the whole log (upcasting old versions) and
returns one line per difference: drift between the log and the rows is a bug.
"""

from __future__ import annotations

import gc
import json
from collections import namedtuple
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.types.datetime import TimestamptzLoader

from runs.event_types import RUN_TRANSITION_EVENTS
from runs.events import upcast
from runs.models import Decision, Event, Run
from runs.prefetch import prefetched

Rows = dict[str, dict[str, Any]]
Reducer = Callable[[Rows, Event, dict[str, Any]], None]


@dataclass
class Projection:
    name: str
    # The stored rows of the runs named (a batch of run ids), in the shape of the replay.
    load_stored: Callable[[Collection[str]], Rows]
    reducers: dict[str, Reducer] = field(default_factory=dict)
    # Turns the replayed rows into the shape of the stored ones, once the whole log is read
    # (a projection whose rows are only comparable at the end: memory/projections.py).
    finish: Callable[[Rows], Rows] | None = None


PROJECTIONS: dict[str, Projection] = {}


def register_projection(projection: Projection) -> Projection:
    PROJECTIONS[projection.name] = projection
    return projection


# Counts kept over the whole log rather than per run (approvals/latency.py): each check
# recounts from the log and returns one line per difference, after the batches of runs.
LOG_CHECKS: dict[str, Callable[[], list[str]]] = {}


def register_log_check(name: str, check: Callable[[], list[str]]) -> None:
    LOG_CHECKS[name] = check


def rebuild(events: Iterable[Event]) -> dict[str, Rows]:
    rebuilt: dict[str, Rows] = {name: {} for name in PROJECTIONS}
    dispatch = _dispatch(rebuilt)
    for event in events:
        _version, payload = upcast(event.event_type, event.schema_version, event.payload)
        for rows, reducer in dispatch.get(event.event_type, ()):
            reducer(rows, event, payload)
    return rebuilt


def _dispatch(rebuilt: dict[str, Rows]) -> dict[str, list[tuple[Rows, Reducer]]]:
    """Each event type's reducers with the rows they change: one look-up per event instead
    of one per projection (the replay's inner loop)."""
    dispatch: dict[str, list[tuple[Rows, Reducer]]] = {}
    for name, projection in PROJECTIONS.items():
        for event_type, reducer in projection.reducers.items():
            dispatch.setdefault(event_type, []).append((rebuilt[name], reducer))
    return dispatch


def diff(name: str, rebuilt: Rows, stored: Rows) -> list[str]:
    lines = []
    for key in sorted(set(rebuilt) | set(stored)):
        if key not in stored:
            lines.append(f"{name} {key}: in the log but missing from the table")
        elif key not in rebuilt:
            lines.append(f"{name} {key}: in the table but never logged")
        else:
            for column in sorted(set(rebuilt[key]) | set(stored[key])):
                was, now = rebuilt[key].get(column), stored[key].get(column)
                if was != now:
                    lines.append(f"{name} {key}: {column} stored={now!r} rebuilt={was!r}")
    return lines


# Reducers read an event's fields only; a plain tuple with the same names costs a fraction of
# building a model instance per event (most of the replay's CPU before). Only the fields the
# reducers read are fetched: no projection reads the two hashes (128 characters), the event's
# id, seq and other ids or its recorded time (the chain check does), and each costs loading
# per row. A reducer reading another field fails loudly (AttributeError): add it here.
EVENT_FIELDS = [
    "run_id",
    "event_type",
    "schema_version",
    "payload",
    "tenant_id",
    "actor",
    "occurred_at",
    "decision_id",
    "tool_call_id",
    "approval_id",
]
EVENT_COLUMNS = [Event._meta.get_field(name).column for name in EVENT_FIELDS]
EventRow = namedtuple("EventRow", EVENT_FIELDS)

# Events replayed before their runs are compared: a batch closes at the first run boundary
# past this many events, so what the check holds is a batch's rebuilt and stored rows (one
# run's, when a run alone is longer), whatever the size of the log. Batches of a fixed number
# of runs held 150,000 events at a time where runs were long.
EVENTS_PER_BATCH = 20_000


def verify() -> list[str]:
    return verify_log()[0]


def verify_log() -> tuple[list[str], int]:
    """(one line per difference, how many events were replayed).

    The log streams once in (run, seq) order; a run's rows are complete when its last event
    has passed, so each batch of whole runs is compared with the stored rows of those runs.
    Every row belongs to a run (foreign keys): the batches, then the runs that have no event
    at all, cover every table. Everything is read in one snapshot (`_snapshot`), so a run
    that moves on while the check runs is not a difference."""
    problems: list[str] = []
    rebuilt: dict[str, Rows] = {name: {} for name in PROJECTIONS}
    dispatch = _dispatch(rebuilt)
    count, in_batch, run_ids, run = 0, 0, [], None
    with _collected_by_batch(), _snapshot(), _log() as events:
        for event in events:
            if event.run_id != run:
                if in_batch >= EVENTS_PER_BATCH:
                    problems += _compare(rebuilt, run_ids)
                    count, in_batch, run_ids = count + in_batch, 0, []
                run = event.run_id
                run_ids.append(run)
            in_batch += 1
            _version, payload = upcast(event.event_type, event.schema_version, event.payload)
            for rows, reducer in dispatch.get(event.event_type, ()):
                reducer(rows, event, payload)
        if run_ids:
            problems += _compare(rebuilt, run_ids)
        count += in_batch
        for unlogged in _runs_without_events():
            problems += _compare(rebuilt, unlogged)
        for check in LOG_CHECKS.values():
            problems += check()
    return problems, count


def _compare(rebuilt: dict[str, Rows], run_ids: list[str]) -> list[str]:
    """The differences between the rows rebuilt for these runs and their stored rows; the
    rebuilt rows are emptied for the next batch (in place: the replay's dispatch holds them)."""
    problems: list[str] = []
    for name, projection in PROJECTIONS.items():
        rows = projection.finish(rebuilt[name]) if projection.finish else rebuilt[name]
        problems += diff(name, rows, projection.load_stored(run_ids))
        rebuilt[name].clear()
    # The batch's rows are freed now; the young objects left are few (_collected_by_batch).
    gc.collect(1)
    return problems


@contextmanager
def _collected_by_batch() -> Iterator[None]:
    """No automatic garbage collection while the check runs; the two young generations are
    collected after each batch instead. A batch's rebuilt rows (tens of thousands of dicts
    and lists) outlive the young generations, so the collector moved them to the oldest one
    and walked them again and again, with everything Django loaded: 8.3 of 20.7 s of the
    check's CPU at a million events (gc.callbacks; 42 full collections of about 130 ms).
    The replay makes no reference cycles (its rows are freed by reference counts when a
    batch is compared); what the comparing queries leave in cycles is collected with the
    batch, so memory still does not grow with the log."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _runs_without_events() -> Iterator[list[str]]:
    """Runs stored with no event (a bug the batches of the log would never meet)."""
    runs = Run.objects.filter(archived_at__isnull=True).exclude(
        Exists(Event.objects.filter(run_id=OuterRef("pk")))
    )
    batch: list[str] = []
    for run_id in runs.order_by("id").values_list("id", flat=True).iterator(chunk_size=500):
        batch.append(run_id)
        if len(batch) == 500:
            yield batch
            batch = []
    if batch:
        yield batch


@contextmanager
def _snapshot() -> Iterator[None]:
    """One transaction for the whole check; when the check opens it (not inside a test's or a
    caller's), REPEATABLE READ makes every query see the same snapshot: the stream of events
    is the log as of its first row, and the rows of a run compared a minute later must be
    those of that moment, not of a run that moved on since. READ ONLY: the check never
    writes, whichever database it is pointed at."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


# The runs' events, archived runs left out: an archived run's rows are in the *_archive
# tables, not the hot ones it would be compared with (verify_event_chain still checks its
# events). In (run, seq) order this is one walk of the index (run_id, seq), without a sort.
_EVENTS_SQL = (
    f"SELECT {', '.join(f'e.{column}' for column in EVENT_COLUMNS)} FROM runs_event e"
    " WHERE NOT EXISTS (SELECT 1 FROM runs_run r WHERE r.id = e.run_id"
    " AND r.archived_at IS NOT NULL) ORDER BY e.run_id, e.seq"
)
FETCH = 5000


# 19 digits or more in a row: a number orjson may read otherwise than json.loads (it holds
# integers in 64 bits, from -2**63 to 2**64 - 1, and reads the others as floats). Found by
# mapping every ASCII digit to "0" and every other byte to a space, then looking for 19
# zeros: 0.3 us a payload, where the regular expression \d{19} took 1.6 us (hex digests
# are long runs of candidate starts; most of the replay's loading, at a million events).
_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_NUMBER = b"0" * 19


class _PayloadLoader(Loader):
    """A payload as `json.loads` reads it (what JSONField gives), by orjson where that is
    the same value, at a third of the cost."""

    def load(self, data: Buffer) -> Any:
        data = bytes(data)
        if _LONG_NUMBER not in data.translate(_DIGITS):
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass  # json.loads decides, and raises as JSONField would
        return json.loads(data)


@contextmanager
def _log() -> Iterator[Iterator[EventRow]]:
    """The events as the ORM would give them, at a fraction of the cost, through a cursor of
    the connection's own (in its transaction): Django's timestamptz loader is psycopg's
    pure-Python one (most of the replay's CPU, with the ORM's per-row converters), so this
    cursor takes psycopg's stock loaders (C, in psycopg_binary) for times and JSON. The
    session's time zone is UTC, as Django sets it; the payload is parsed by json.loads, as
    JSONField does."""
    if connection.vendor != "postgresql":  # SQLite (the demo): the ORM's rows
        events = Event.objects.filter(run__archived_at__isnull=True).order_by("run_id", "seq")
        yield map(EventRow._make, events.values_list(*EVENT_FIELDS).iterator(2000))
        return
    connection.ensure_connection()
    # Server-side: the log streams FETCH rows at a time, never all at once.
    with connection.connection.cursor(name="replay_events") as cursor:
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.adapters.register_loader("jsonb", _PayloadLoader)
        cursor.execute(_EVENTS_SQL)
        rows = _rows(cursor)
        try:
            yield rows
        finally:
            rows.close()  # its fetching thread ends before the cursor closes


def _rows(cursor: Any) -> Iterator[EventRow]:
    # The next FETCH rows are fetched while these are replayed (runs/prefetch.py).
    with closing(prefetched(cursor.fetchmany, FETCH)) as chunks:
        for rows in chunks:
            yield from map(EventRow._make, rows)


# --- runs -----------------------------------------------------------------------------------

RUN_COLUMNS = (
    "state",
    "title",
    "correlation_id",
    "external_ref",
    "max_tool_calls",
    "max_attempts",
)


def _stored_runs(run_ids: Collection[str]) -> Rows:
    rows = Run.objects.filter(pk__any=run_ids, archived_at__isnull=True).values(
        "id", "tenant_id", "deadline", *RUN_COLUMNS
    )
    return {
        row["id"]: {
            **{column: row[column] for column in RUN_COLUMNS},
            "tenant": row["tenant_id"],
            "deadline": row["deadline"].isoformat() if row["deadline"] else None,
        }
        for row in rows
    }


def _run_started(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.run_id] = {
        "state": Run.State.ACTIVE,
        "title": payload["title"],
        "correlation_id": payload["correlation_id"],
        "external_ref": payload.get("external_ref"),
        "max_tool_calls": payload["max_tool_calls"],
        "max_attempts": payload["max_attempts"],
        "deadline": payload["deadline"],
        "tenant": event.tenant_id,
    }


def _run_transition(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.run_id]["state"] = payload["to"]


runs_projection = register_projection(
    Projection(
        name="run",
        load_stored=_stored_runs,
        reducers={
            "run.started": _run_started,
            **{event_type: _run_transition for event_type in RUN_TRANSITION_EVENTS.values()},
        },
    )
)


# --- decisions ------------------------------------------------------------------------------


def _stored_decisions(run_ids: Collection[str]) -> Rows:
    rows = Decision.objects.filter(run_id__any=run_ids).values(
        "id", "run_id", "kind", "version", "content", "supersedes_id"
    )
    return {
        row["id"]: {
            "run": row["run_id"],
            "kind": row["kind"],
            "version": row["version"],
            "content": row["content"],
            "supersedes": row["supersedes_id"],
        }
        for row in rows
    }


def _decision_recorded(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.decision_id] = {
        "run": event.run_id,
        "kind": payload["kind"],
        "version": payload["version"],
        "content": payload["content"],
        "supersedes": payload["supersedes"],
    }


register_projection(
    Projection(
        name="decision",
        load_stored=_stored_decisions,
        reducers={"decision.recorded": _decision_recorded},
    )
)
