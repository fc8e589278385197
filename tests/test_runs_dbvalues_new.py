"""runs/dbvalues.py's `new` makes the instance `Model(**values)` makes: the same attributes
(the values named, every other field's default), the same state, the same row once saved;
and it leaves to the constructor what it cannot do the same way (an init signal listening, a
field whose descriptor does more than store, a name that is not a field's)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db.models.signals import post_init

from runs import dbvalues, events
from runs.models import Event, OutboxMessage, Run
from toolcalls.models import Attempt, ToolCall

MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
EVENT = {
    "id": "evt_new_0001",
    "run_id": "run_x",
    "seq": 7,
    "event_type": "tool_call.dispatching",
    "schema_version": 1,
    "producer": "dispatcher",
    "tenant_id": "ten_x",
    "actor": "system:dispatcher",
    "tool_call_id": "tc_x",
    "correlation_id": "corr",
    "causation_id": "evt_before",
    "occurred_at": MOMENT,
    "recorded_at": MOMENT,
    "payload": {"from": "authorized", "to": "dispatching", "attempt": 1},
    "prev_hash": "0" * 64,
}


def _attributes(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in obj.__dict__.items() if k != "_state"}


def _same(mine: Any, theirs: Any) -> None:
    assert type(mine) is type(theirs)
    assert list(mine.__dict__) == list(theirs.__dict__)  # the same attributes, in field order
    assert _attributes(mine) == _attributes(theirs)
    assert (mine._state.adding, mine._state.db) == (theirs._state.adding, theirs._state.db)
    assert mine._state.fields_cache == theirs._state.fields_cache == {}


def test_an_event_is_made_as_its_constructor_makes_it() -> None:
    mine = dbvalues.new(Event, dict(EVENT))
    _same(mine, Event(**EVENT))
    # Fields not named take their defaults: the blank ids and the hash, set after.
    assert (mine.turn_id, mine.decision_id, mine.approval_id, mine.hash) == ("", "", "", "")
    assert events.compute_hash(mine) == events.compute_hash(Event(**EVENT))


def test_a_default_that_is_made_each_time_is_made_for_each_instance() -> None:
    values = {k: v for k, v in EVENT.items() if k != "id"}
    first, second = dbvalues.new(Event, values), dbvalues.new(Event, values)
    assert first.id.startswith("evt_") and second.id.startswith("evt_")
    assert first.id != second.id
    # Everything else as the constructor gives it.
    _same(dbvalues.new(Event, {**values, "id": first.id}), Event(**{**values, "id": first.id}))


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (OutboxMessage, {"task": "toolcalls.dispatch", "args": ["tc_x"], "available_at": MOMENT}),
        (
            Attempt,
            {"tool_call_id": "tc_x", "run_id": "run_x", "number": 2, "fencing_token": 2},
        ),
    ],
)
def test_other_models_take_every_default_the_constructor_takes(
    model: Any, values: dict[str, Any]
) -> None:
    mine = dbvalues.new(model, dict(values))
    theirs = model(**values, id=mine.id)
    _same(mine, theirs)


def test_a_listener_of_init_gets_the_constructors_instance() -> None:
    seen: list[Any] = []

    def listen(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(listen, sender=Event)
    try:
        made = dbvalues.new(Event, dict(EVENT))
    finally:
        post_init.disconnect(listen, sender=Event)
    assert seen == [made]


def test_a_model_with_state_proxies_goes_through_its_constructor() -> None:
    """The FSM fields' descriptors (django-fsm) do more than store a value: not made here."""
    assert dbvalues._defaults(ToolCall) == {} and dbvalues._defaults(Run) == {}
    call = dbvalues.new(ToolCall, {"id": "tc_new", "run_id": "run_x"})
    assert call.execution_status == ToolCall(id="tc_new", run_id="run_x").execution_status


def test_a_name_that_is_no_fields_is_refused_as_the_constructor_refuses_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword"):
        dbvalues.new(Event, {**EVENT, "not_a_field": 1})
