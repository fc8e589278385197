"""Event types of run memory, with the JSON Schema of each version's payload."""

from __future__ import annotations

from runs.events import register

STR = {"type": "string"}
INT = {"type": "integer"}
IDS = {"type": "array", "items": STR}

# The checkpoint's body stays in its row; the event carries its digest (so the hash chain
# vouches for the content) and where the agent was.
register(
    "checkpoint.saved",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": [
            "checkpoint_id",
            "name",
            "kind",
            "version",
            "schema_version",
            "body_digest",
            "size_bytes",
            "state",
            "step_index",
        ],
        "properties": {
            "checkpoint_id": STR,
            "name": STR,
            "kind": STR,
            "version": INT,
            "schema_version": INT,
            "body_digest": STR,
            "size_bytes": INT,
            "state": STR,
            "step_index": INT,
            "decision_ids": IDS,
            "tool_call_ids": IDS,
        },
    },
)

# A fact of its own kind: nothing in the runtime changes because of it.
register(
    "feedback.recorded",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["feedback_id", "subject_kind", "subject_id", "rating", "label", "text"],
        "properties": {
            "feedback_id": STR,
            "subject_kind": {"enum": ["run", "decision", "tool_call", "approval"]},
            "subject_id": STR,
            "rating": {"type": ["integer", "null"], "minimum": 1, "maximum": 5},
            "label": STR,
            "text": STR,
        },
    },
)

# The run ended and its checkpoints are final (memory/checkpoints.py, checkpoints_archive).
register(
    "checkpoints.archived",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["checkpoint_ids", "reason"],
        "properties": {"checkpoint_ids": IDS, "reason": STR},
    },
)

# `archive_runs` moved the run's runtime rows to the *_archive tables (memory/archive.py):
# how many of each table, and why. The run row and its events stay.
register(
    "run.archived",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["moved", "reason"],
        "properties": {
            "moved": {"type": "object", "additionalProperties": INT},
            "reason": STR,
        },
    },
)
