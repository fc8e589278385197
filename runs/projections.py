"""Rebuild state from the event log and compare it with the stored rows.

A projection names the rows it owns, how each event type changes them, and how to read the
stored rows in the same shape. `verify` replays the whole log (upcasting old versions) and
returns one line per difference: drift between the log and the rows is a bug.
"""

from __future__ import annotations

import json
import re
from collections import namedtuple
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db import connection, transaction
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.types.datetime import TimestamptzLoader

from runs.event_types import RUN_TRANSITION_EVENTS
from runs.events import upcast
from runs.models import Decision, Event, Run

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
    for event in events:
        _version, payload = upcast(event.event_type, event.schema_version, event.payload)
        for name, projection in PROJECTIONS.items():
            reducer = projection.reducers.get(event.event_type)
            if reducer is not None:
                reducer(rebuilt[name], event, payload)
    return rebuilt


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
# building a model instance per event (most of the replay's CPU before).
EVENT_FIELDS = [field.attname for field in Event._meta.concrete_fields]
EVENT_COLUMNS = [field.column for field in Event._meta.concrete_fields]
EventRow = namedtuple("EventRow", EVENT_FIELDS)

# Runs replayed and compared at a time: what the check holds in memory is one batch's
# events and rows, whatever the size of the log.
RUNS_PER_BATCH = 500


def verify() -> list[str]:
    """Replay the log a batch of runs at a time and compare what each batch rebuilds with
    the stored rows of those runs. Every row and event belongs to a run (foreign keys), so
    the batches together cover the whole log and every table."""
    problems: list[str] = []
    with transaction.atomic(), _event_cursor() as cursor:
        for run_ids in run_batches():
            rebuilt = rebuild(_events_of(cursor, run_ids))
            for name, projection in PROJECTIONS.items():
                rows = projection.finish(rebuilt[name]) if projection.finish else rebuilt[name]
                problems += diff(name, rows, projection.load_stored(run_ids))
    for check in LOG_CHECKS.values():
        problems += check()
    return problems


_EVENTS_SQL = (
    f"SELECT {', '.join(EVENT_COLUMNS)} FROM runs_event WHERE run_id = ANY(%s) ORDER BY run_id, seq"
)


# 19 digits or more: a number orjson may read otherwise than json.loads (it holds integers
# in 64 bits, from -2**63 to 2**64 - 1, and reads the others as floats).
_LONG_NUMBER = re.compile(rb"\d{19}")


class _PayloadLoader(Loader):
    """A payload as `json.loads` reads it (what JSONField gives), by orjson where that is
    the same value, at a third of the cost."""

    def load(self, data: Buffer) -> Any:
        if _LONG_NUMBER.search(data) is None:
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass  # json.loads decides, and raises as JSONField would
        return json.loads(bytes(data))


@contextmanager
def _event_cursor() -> Iterator[Any]:
    """A cursor of the connection's own (in its transaction) that reads events as the ORM
    would give them, at a fraction of the cost: Django's timestamptz loader is psycopg's
    pure-Python one (most of the replay's CPU, with the ORM's per-row converters), so this
    cursor takes psycopg's stock loaders (C, in psycopg_binary) for times and JSON. The
    session's time zone is UTC, as Django sets it; the payload is parsed by json.loads, as
    JSONField does."""
    if connection.vendor != "postgresql":
        yield None  # SQLite (the demo): the ORM's rows
        return
    connection.ensure_connection()
    # Server-side: a batch's events stream in chunks, never all at once.
    with connection.connection.cursor(name="replay_events") as cursor:
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
        cursor.adapters.register_loader("jsonb", _PayloadLoader)
        yield cursor


def _events_of(cursor: Any, run_ids: list[str]) -> Iterator[EventRow]:
    if cursor is None:
        events = Event.objects.filter(run_id__in=run_ids).order_by("run_id", "seq")
        yield from map(EventRow._make, events.values_list(*EVENT_FIELDS).iterator(2000))
        return
    cursor.execute(_EVENTS_SQL, [run_ids])
    while rows := cursor.fetchmany(2000):
        yield from map(EventRow._make, rows)


def run_batches() -> Iterator[list[str]]:
    size = RUNS_PER_BATCH
    # An archived run's rows are in the *_archive tables, not the hot ones it would be
    # compared with: it is left out (verify_event_chain still checks its events).
    ids = Run.objects.filter(archived_at__isnull=True).order_by("id").values_list("id", flat=True)
    batch: list[str] = []
    for run_id in ids.iterator(chunk_size=size):
        batch.append(run_id)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


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
    rows = Run.objects.filter(pk__in=run_ids, archived_at__isnull=True).values(
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
    rows = Decision.objects.filter(run_id__in=run_ids).values(
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
