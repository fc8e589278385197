"""One write path for every state machine (runs, tool calls, approvals): check the transition,
apply it, append its event and save the row, all in the caller's transaction.

The contract, for every caller: hold the row lock inside `transaction.atomic()`, set any other
fields the change needs, then call `apply` (through the app's wrapper: `run_transition`,
`tool_call_transition`, `approval_transition`). Nobody saves afterwards and nobody sets a
state field by hand (the fields are `protected=True`). Work that must follow the change goes
through `runs.outbox.enqueue` in the same transaction; it is published on commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, models
from django_fsm import can_proceed

from runs import events
from runs.changes import SavesChangedFields
from runs.errors import DomainError
from runs.models import Event, Run


def apply(
    obj: models.Model,
    action: str,
    *,
    field: str,
    event_type: str,
    run: Run,
    actor: str,
    producer: str,
    ids: events.Ids = events.NO_IDS,
    reason: str = "",
    refusal: str,
    occurred_at: datetime | None = None,
    **details: Any,
) -> Event:
    """Apply transition `action` of `obj`, append its event with `from`, `to`, `reason` and any
    non-empty details, and save `obj`. `refusal` names the error when it is not allowed."""
    if not connection.in_atomic_block:
        raise RuntimeError("a state change is written in a transaction, with the row locked")
    before = getattr(obj, field)
    method = getattr(obj, action)
    if not can_proceed(method):
        raise DomainError(refusal, f"{obj.pk} is {before}; it cannot {action.replace('_', ' ')}.")
    method()
    payload: dict[str, Any] = {"from": before, "to": getattr(obj, field)}
    if reason:
        payload["reason"] = reason
    payload.update({key: value for key, value in details.items() if value not in (None, "")})
    event = events.append(
        run=run,
        event_type=event_type,
        payload=payload,
        producer=producer,
        actor=actor,
        ids=ids,
        occurred_at=occurred_at,
    )
    # A row that knows what it was read with writes only what changed (runs/changes.py).
    changed = obj.changed_fields() if isinstance(obj, SavesChangedFields) else None
    if changed is None:
        obj.save()
    else:
        obj.save(update_fields=changed)
    return event
