"""Typed facts about a tenant's administration (runs/admin_event_models.py): each type has a
JSON Schema in the registry of runs/events.py, and each is written in the transaction of the
change it records, so a change that rolls back leaves no fact and a fact never lacks its
change."""

from __future__ import annotations

from typing import Any

from django.db import connection

from runs import events
from runs.admin_event_models import AdminEvent
from runs.models import Tenant, User

STR = {"type": "string"}
STRS = {"type": "array", "items": STR}

events.register(
    "user.role_changed",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["from", "to"],
        "properties": {"from": STR, "to": STR},
    },
)
events.register(
    "api_key.issued",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "scopes"],
        "properties": {
            "name": STR,
            "scopes": STRS,
            "principal": STR,
            "expires_at": {"type": ["string", "null"]},
        },
    },
)
events.register(
    "api_key.revoked",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {"name": STR},
    },
)


def admin_event_append(
    *, tenant: Tenant, event_type: str, subject: str, payload: dict[str, Any], by: User
) -> AdminEvent:
    """Record one fact, in the caller's transaction; a payload its schema refuses raises."""
    if not connection.in_atomic_block:
        raise RuntimeError("admin events are written inside the transaction of their change")
    version = events.latest_version(event_type)
    events.validate(event_type, version, payload)
    return AdminEvent.objects.create(
        tenant=tenant,
        event_type=event_type,
        schema_version=version,
        actor=f"user:{by.username}",
        subject=subject,
        payload=events.rfc8785_roundtrip(payload),
    )
