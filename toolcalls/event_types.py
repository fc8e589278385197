"""Event types of tool calls. Each execution or verification transition logs `from` and `to`."""

from __future__ import annotations

from runs.event_types import transition_schema
from runs.events import register

STR = {"type": "string"}
INT = {"type": "integer"}
NULLABLE_STR = {"type": ["string", "null"]}

register(
    "tool_call.proposed",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "capability",
            "capability_version",
            "args",
            "args_digest",
            "idempotency_key",
            "external_request_id",
            "intent",
            "object_ref",
            "object_revision",
        ],
        "properties": {
            "capability": STR,
            "capability_version": INT,
            "args": {"type": "object"},
            "args_digest": STR,
            "idempotency_key": STR,
            "external_request_id": STR,
            "intent": STR,
            "object_ref": STR,
            "object_revision": {"type": ["integer", "null"]},
            "compensation_of": NULLABLE_STR,
            "depends_on": {"type": "array", "items": STR},
            "summary": STR,
        },
    },
)

# Execution transitions, keyed by the ToolCall method that makes them.
EXECUTION_EVENTS = {
    "request_approval": "tool_call.awaiting_approval",
    "authorize": "tool_call.authorized",
    "claim": "tool_call.dispatching",
    "accept": "tool_call.accepted",
    "complete": "tool_call.completed",
    "fail": "tool_call.failed",
    "mark_unknown": "tool_call.result_unknown",
    "hand_to_human": "tool_call.needs_human",
    "cancel": "tool_call.cancelled",
    "reject": "tool_call.rejected",
    "expire": "tool_call.expired",
    "invalidate": "tool_call.invalidated",
    "start_compensation": "tool_call.compensating",
    "finish_compensation": "tool_call.compensated",
}
VERIFICATION_EVENTS = {
    "await_verification": "tool_call.verification_pending",
    "confirm_success": "tool_call.confirmed_success",
    "confirm_failure": "tool_call.confirmed_failure",
    "find_inconclusive": "tool_call.inconclusive",
}

# What transitions may carry besides from/to/reason.
DETAILS = {
    "error_name": STR,
    "message": STR,
    "attempt_id": STR,
    "attempt": INT,
    "fencing_token": INT,
    "lease_expires_at": STR,
    "next_attempt_at": STR,
    "delay_seconds": {"type": "number"},
    "receipt_id": STR,
    "external_id": STR,
    "receipt_status": STR,
    "source": STR,
    "http_status": INT,
    "evidence": STR,
}

for _event_type in [*EXECUTION_EVENTS.values(), *VERIFICATION_EVENTS.values()]:
    register(_event_type, 1, transition_schema(**DETAILS))

# Facts that change no state, logged so that the timeline explains what happened.
register(
    "tool_call.stale_result_refused",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["attempt_id", "fencing_token", "current_token", "outcome"],
        "properties": {
            "attempt_id": STR,
            "fencing_token": INT,
            "current_token": INT,
            "status_now": STR,
            "outcome": STR,
            "external_id": STR,
        },
    },
)
register(
    "tool_call.looked_up",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["found", "lookup"],
        "properties": {
            "found": {"type": "boolean"},
            "lookup": INT,
            "within_consistency_window": {"type": "boolean"},
            # Why the look-up proved nothing: a stable name, and the detail in words.
            "error_name": STR,
            "message": STR,
            "external_id": STR,
        },
    },
)
register(
    "tool_call.desk_claimed",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["by"],
        "properties": {"by": STR, "from": STR},
    },
)
register(
    "tool_call.deferred",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["error_name", "until"],
        "properties": {"error_name": STR, "until": STR, "message": STR},
    },
)
