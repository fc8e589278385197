"""One write path for every state machine (runs, tool calls, approvals): check the transition,
apply it, append its event and save the row, all in the caller's transaction.

The contract, for every caller: hold the row lock inside `transaction.atomic()`, set any other
fields the change needs, then call `apply` (through the app's wrapper: `run_transition`,
`tool_call_transition`, `approval_transition`). Nobody saves afterwards and nobody sets a
state field by hand (the fields are `protected=True`). Work that must follow the change goes
through `runs.outbox.enqueue` in the same transaction; it is published on commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import connection, models
from django_fsm import ANY_OTHER_STATE, ANY_STATE, FSMFieldMixin, can_proceed
from django_fsm.signals import post_transition, pre_transition

from runs import events, sql
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
    at: datetime | None = None,
    **details: Any,
) -> Event:
    """Apply transition `action` of `obj`, append its event with `from`, `to`, `reason` and any
    non-empty details, and save `obj`. `refusal` names the error when it is not allowed.
    `at`: the moment of the transition, as the caller read the clock just now (the event's
    time: `events.append`)."""
    # An open event batch is inside a transaction; otherwise ask the connection (a proxy:
    # each attribute read finds the thread's connection again).
    if not events.in_batch() and not connection.in_atomic_block:
        raise RuntimeError("a state change is written in a transaction, with the row locked")
    before = getattr(obj, field)
    if not _transition(obj, action, before):
        raise DomainError(refusal, f"{obj.pk} is {before}; it cannot {action.replace('_', ' ')}.")
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
        at=at,
    )
    if id(obj) not in _saved_later():
        save_changed(obj)
    else:
        _touched().add(id(obj))
    return event


def _transition(obj: models.Model, action: str, state: Any) -> bool:
    """Take transition `action` of `obj` from `state` as django-fsm does; False when it may
    not. django-fsm's own path (`can_proceed`, then the method: the transition looked up four
    times, both signals sent) was ~16 Python calls a transition, five per dispatched call
    (profile_dispatch --profile). A transition without conditions, error state, dynamic
    target or proxy, while no receiver listens to django-fsm's signals, is taken here in
    two; any other goes django-fsm's way. tests/test_runs_transitions_fast.py compares them."""
    table = _direct(type(obj), action)
    if table is None or pre_transition.receivers or post_transition.receivers:
        method = getattr(obj, action)
        if not can_proceed(method):
            return False
        method()
        return True
    attname, transitions = table
    found = transitions.get(state)
    if found is None:
        return False
    found.method(obj)
    obj.__dict__[attname] = found.target  # django-fsm's set_state
    return True


_DIRECT: dict[tuple[type, str], tuple[str, dict[Any, Any]] | None] = {}


def _direct(model: type, action: str) -> tuple[str, dict[Any, Any]] | None:
    """(the state's attname, source -> transition) of a transition `_transition` may take
    itself, or None; found once per model and action."""
    key = (model, action)
    if key not in _DIRECT:
        meta = getattr(getattr(model, action, None), "_django_fsm", None)
        field = getattr(meta, "field", None)
        simple = (
            isinstance(field, FSMFieldMixin)
            and not field.state_proxy
            and all(
                not t.conditions
                and t.on_error is None
                and isinstance(t.target, str)
                and source not in (ANY_STATE, ANY_OTHER_STATE)
                for source, t in meta.transitions.items()
            )
        )
        _DIRECT[key] = (field.name, dict(meta.transitions)) if simple else None
    return _DIRECT[key]


def save_changed(obj: models.Model) -> None:
    # A row that knows what it was read with writes only what changed (runs/changes.py).
    changed = obj.changed_fields() if isinstance(obj, SavesChangedFields) else None
    if changed is None:
        obj.save()
    elif changed:
        sql.update_fields(obj, changed)


def save_fields(obj: models.Model, names: list[str]) -> None:
    """`obj.save(update_fields=names)` for a change that is not a transition, or, inside a
    block that saves `obj` when it ends (`saved_once`, `saved_together`), left to that save:
    a verification that is not conclusive yet, judged in its call's record transaction."""
    if id(obj) in _saved_later():
        _touched().add(id(obj))
    else:
        obj.save(update_fields=names)


_local = threading.local()


def _saved_later() -> dict[int, models.Model]:
    if not hasattr(_local, "rows"):
        _local.rows = {}
    return _local.rows


@contextmanager
def saved_once(obj: models.Model) -> Iterator[None]:
    """Inside the block, the transitions of `obj` append their events but do not save it: it
    is saved once when the block ends, with every column they changed. A record step takes
    a call through three transitions (accept, complete, await_verification): one UPDATE
    rather than three, each compiled by the ORM (profile_dispatch). The events stay one per
    transition, in the same transaction. Nothing in the block may read the row back from the
    database; a block that raises saves nothing (its transaction rolls back)."""
    rows = _saved_later()
    if id(obj) in rows:
        # Nested: the outer block saves it, as this block would have (touched, for an outer
        # `saved_together`, which saves only the rows that took a transition).
        _touched().add(id(obj))
        yield
        return
    rows[id(obj)] = obj
    try:
        yield
    finally:
        del rows[id(obj)]
        _touched().discard(id(obj))  # `apply` marks it; an id left here could name another row
    save_changed(obj)


def _touched() -> set[int]:
    if not hasattr(_local, "touched"):
        _local.touched = set()
    return _local.touched


@contextmanager
def saved_together(objs: list[models.Model]) -> Iterator[None]:
    """`saved_once` for many rows of one model: those that took a transition in the block are
    saved when it ends, the rows that changed the same columns in one UPDATE (a dispatch
    batch's verifications: one statement, not one per call). The same rules: nothing in the
    block reads these rows back from the database; a block that raises saves nothing."""
    rows, touched = _saved_later(), _touched()
    mine = [obj for obj in objs if id(obj) not in rows]
    rows.update((id(obj), obj) for obj in mine)
    try:
        yield
        changed = [obj for obj in mine if id(obj) in touched]
    finally:
        for obj in mine:
            del rows[id(obj)]
            touched.discard(id(obj))
    groups: dict[tuple[str, ...], list[models.Model]] = {}
    for obj in changed:
        names = obj.changed_fields() if isinstance(obj, SavesChangedFields) else None
        if names is None or len(changed) == 1:
            save_changed(obj)
        elif names:
            groups.setdefault(tuple(names), []).append(obj)
    for names, group in groups.items():
        sql.update_many(group, list(names))
