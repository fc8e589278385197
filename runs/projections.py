"""Rebuild state from the event log and compare it with the stored rows.

A projection names the rows it owns, how each event type changes them, and how to read the
stored rows in the same shape. `verify` replays the whole log (upcasting old versions) and
returns one line per difference: drift between the log and the rows is a bug.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
    load_stored: Callable[[], Rows]
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


def verify() -> list[str]:
    # An archived run's rows are in the *_archive tables, not the hot ones it would be
    # compared with: its events are left out of the replay (verify_event_chain checks them).
    events = (
        Event.objects.filter(run__archived_at__isnull=True)
        .order_by("run_id", "seq")
        .iterator(chunk_size=2000)
    )
    rebuilt = rebuild(events)
    problems: list[str] = []
    for name, projection in PROJECTIONS.items():
        rows = projection.finish(rebuilt[name]) if projection.finish else rebuilt[name]
        problems += diff(name, rows, projection.load_stored())
    return problems


# --- runs -----------------------------------------------------------------------------------

RUN_COLUMNS = (
    "state",
    "title",
    "correlation_id",
    "external_ref",
    "max_tool_calls",
    "max_attempts",
)


def _stored_runs() -> Rows:
    rows = Run.objects.filter(archived_at__isnull=True).values(
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


def _stored_decisions() -> Rows:
    rows = Decision.objects.values("id", "run_id", "kind", "version", "content", "supersedes_id")
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
