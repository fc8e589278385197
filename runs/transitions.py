"""One write path for every state machine: check, transition, log. The caller saves the row
in the same transaction."""

from __future__ import annotations

from typing import Any

from django.db import models
from django_fsm import can_proceed

from runs import events
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
    **details: Any,
) -> Event:
    """Apply transition `action` of `obj` and append its event with `from`, `to`, `reason`
    and any non-empty details. `refusal` names the error when the transition is not allowed."""
    before = getattr(obj, field)
    method = getattr(obj, action)
    if not can_proceed(method):
        raise DomainError(refusal, f"{obj.pk} is {before}; it cannot {action.replace('_', ' ')}.")
    method()
    payload: dict[str, Any] = {"from": before, "to": getattr(obj, field)}
    if reason:
        payload["reason"] = reason
    payload.update({key: value for key, value in details.items() if value not in (None, "")})
    return events.append(
        run=run, event_type=event_type, payload=payload, producer=producer, actor=actor, ids=ids
    )
