"""Tool call state rebuilt from the log, compared by `rebuild_projections --verify`."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from runs.models import Event
from runs.projections import Projection, Rows, register_projection
from toolcalls.event_types import EXECUTION_EVENTS, VERIFICATION_EVENTS
from toolcalls.models import ToolCall

COLUMNS = (
    "execution_status",
    "verification_status",
    "fencing_token",
    "idempotency_key",
    "args_digest",
    "external_id",
    "run_id",
)


def _stored(run_ids: Collection[str]) -> Rows:
    calls = ToolCall.objects.filter(run_id__any=run_ids)
    return {row.pop("id"): row for row in calls.values("id", *COLUMNS)}


def _proposed(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.tool_call_id] = {
        "execution_status": "proposed",
        "verification_status": "not_observed",
        "fencing_token": 0,
        "idempotency_key": payload["idempotency_key"],
        "args_digest": payload["args_digest"],
        "external_id": "",
        "run_id": event.run_id,
    }


def _execution(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    row = rows[event.tool_call_id]
    row["execution_status"] = payload["to"]
    if "fencing_token" in payload:
        row["fencing_token"] = payload["fencing_token"]
    if "external_id" in payload and event.event_type == "tool_call.accepted":
        row["external_id"] = payload["external_id"]


def _args_edited(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.tool_call_id]["args_digest"] = payload["to_digest"]


def _verification(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.tool_call_id]["verification_status"] = payload["to"]


register_projection(
    Projection(
        name="tool_call",
        load_stored=_stored,
        reducers={
            "tool_call.proposed": _proposed,
            "tool_call.args_edited": _args_edited,
            **{event_type: _execution for event_type in EXECUTION_EVENTS.values()},
            **{event_type: _verification for event_type in VERIFICATION_EVENTS.values()},
        },
    )
)
