"""Event types of approvals."""

from __future__ import annotations

from runs.event_types import transition_schema
from runs.events import register

STR = {"type": "string"}
INT = {"type": "integer"}

register(
    "approval.required",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "policy_version",
            "rule",
            "required_approvers",
            "expires_at",
            "args_digest",
            "summary_hash",
            "risk",
            "object_ref",
        ],
        "properties": {
            "policy_version": INT,
            "rule": STR,
            "required_approvers": INT,
            "expires_at": STR,
            "args_digest": STR,
            "summary_hash": STR,
            "summary": STR,
            "risk": STR,
            "object_ref": STR,
            "object_revision": {"type": ["integer", "null"]},
            "permission": STR,
            "requested_by": STR,
        },
    },
)
register(
    "approval.decision_recorded",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["user", "decision", "summary_hash"],
        "properties": {
            "user": STR,
            "decision": STR,
            "reason": STR,
            "summary_hash": STR,
            "edit_diff": {"type": "object"},
            "approvals": INT,
            "required_approvers": INT,
        },
    },
)
register(
    "approval.escalated",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["to", "expires_at"],
        "properties": {
            "to": {"type": "array", "items": STR},
            "expires_at": STR,
            # Targets of the escalation group that named nobody (no such address or group).
            "unresolved": {"type": "array", "items": STR},
        },
    },
)
register(
    "tool_call.args_edited",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["from_digest", "to_digest", "diff", "args"],
        "properties": {
            "from_digest": STR,
            "to_digest": STR,
            "diff": {"type": "object"},
            "args": {"type": "object"},
            "by": STR,
        },
    },
)

APPROVAL_EVENTS = {
    "approve": "approval.approved",
    "reject": "approval.rejected",
    "consume": "approval.consumed",
    "expire": "approval.expired",
    "invalidate": "approval.invalidated",
    "cancel": "approval.cancelled",
}
for _event_type in APPROVAL_EVENTS.values():
    register(_event_type, 1, transition_schema(attempt_id=STR, by=STR))
