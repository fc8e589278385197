"""Event types of runs and decisions, with the JSON Schema of each version's payload."""

from __future__ import annotations

from runs.events import register

# Every state transition of any machine logs where it came from and where it went; replay
# needs nothing else to rebuild the state column.
TRANSITION = {
    "type": "object",
    "required": ["from", "to"],
    "properties": {
        "from": {"type": "string"},
        "to": {"type": "string"},
        "reason": {"type": "string"},
    },
}


def transition_schema(**extra: dict) -> dict:
    return {
        **TRANSITION,
        "properties": {**TRANSITION["properties"], **extra},
        "additionalProperties": False,
    }


RUN_STARTED = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "correlation_id", "max_tool_calls", "max_attempts", "deadline"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "correlation_id": {"type": "string"},
        "max_tool_calls": {"type": "integer", "minimum": 1},
        "max_attempts": {"type": "integer", "minimum": 1},
        "deadline": {"type": ["string", "null"], "format": "date-time"},
        "metadata": {"type": "object"},
        # Optional: the framework's thread or conversation id (absent from older events).
        "external_ref": {"type": "string", "minLength": 1, "maxLength": 200},
    },
}

DECISION_RECORDED = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "version", "content", "supersedes"],
    "properties": {
        "kind": {"type": "string", "minLength": 1},
        "version": {"type": "integer", "minimum": 1},
        "content": {"type": "object"},
        "supersedes": {"type": ["string", "null"]},
    },
}

RUN_TRANSITION_EVENTS = {
    # transition method on Run -> event type
    "wait": "run.waiting",
    "resume": "run.resumed",
    "complete": "run.completed",
    "complete_with_degradation": "run.completed_with_degradation",
    "hand_to_human": "run.needs_human",
    "fail_permanently": "run.failed_permanently",
    "cancel": "run.cancelled",
}

register("run.started", 1, RUN_STARTED)
register("decision.recorded", 1, DECISION_RECORDED)
for _event_type in RUN_TRANSITION_EVENTS.values():
    register(_event_type, 1, transition_schema())

# Run-scoped credentials (runs/credentials.py): minted by a key, revoked at the run's end.
# Neither carries the token, only ids.
register(
    "run.credential_minted",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["credential_id", "api_key_id", "scopes", "expires_at"],
        "properties": {
            "credential_id": {"type": "string"},
            "api_key_id": {"type": "string"},
            "scopes": {"type": "array", "items": {"type": "string"}},
            "expires_at": {"type": "string", "format": "date-time"},
        },
    },
)
register(
    "run.credentials_revoked",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["credential_ids", "reason"],
        "properties": {
            "credential_ids": {"type": "array", "items": {"type": "string"}},
            "reason": {"type": "string"},
        },
    },
)
