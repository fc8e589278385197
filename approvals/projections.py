"""Approval state rebuilt from the log, compared by `rebuild_projections --verify`."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from approvals import latency
from approvals.event_types import APPROVAL_EVENTS
from approvals.models import Approval
from runs.models import Event
from runs.projections import Projection, Rows, register_log_check, register_projection


def _stored(run_ids: Collection[str]) -> Rows:
    rows = Approval.objects.filter(run_id__any=run_ids).values(
        "id", "state", "tool_call_id", "args_digest", "required_approvers"
    )
    return {row.pop("id"): row for row in rows}


def _required(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.approval_id] = {
        "state": "pending",
        "tool_call_id": event.tool_call_id,
        "args_digest": payload["args_digest"],
        "required_approvers": payload["required_approvers"],
    }


def _transition(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[event.approval_id]["state"] = payload["to"]


register_projection(
    Projection(
        name="approval",
        load_stored=_stored,
        reducers={
            "approval.required": _required,
            **{event_type: _transition for event_type in APPROVAL_EVENTS.values()},
        },
    )
)

register_log_check("approval_latency", latency.verify)
