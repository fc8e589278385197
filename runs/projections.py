"""Rebuild state from the event log and compare it with the stored rows.

A projection names the rows it owns, how each event type changes them, and how to read the
stored rows in the same shape. `verify` replays the whole log (upcasting old versions) and
returns one line per difference: drift between the log and the rows is a bug.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

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
EventRow = namedtuple("EventRow", EVENT_FIELDS)

# Runs replayed and compared at a time: what the check holds in memory is one batch's
# events and rows, whatever the size of the log.
RUNS_PER_BATCH = 500


def verify() -> list[str]:
    """Replay the log a batch of runs at a time and compare what each batch rebuilds with
    the stored rows of those runs. Every row and event belongs to a run (foreign keys), so
    the batches together cover the whole log and every table."""
    problems: list[str] = []
    for run_ids in run_batches():
        events = Event.objects.filter(run_id__in=run_ids).order_by("run_id", "seq")
        rows = events.values_list(*EVENT_FIELDS).iterator(chunk_size=2000)
        rebuilt = rebuild(map(EventRow._make, rows))
        for name, projection in PROJECTIONS.items():
            rows = projection.finish(rebuilt[name]) if projection.finish else rebuilt[name]
            problems += diff(name, rows, projection.load_stored(run_ids))
    return problems


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
