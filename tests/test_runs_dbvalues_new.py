"""runs/dbvalues.py's `new` makes the instance `Model(**values)` makes (values, defaults,
related objects cached, django-fsm's protected statuses, signals, the names `__init__`
refuses), and a row whose statuses are TextChoices members is prepared as the ORM prepares
it, without the per-field path."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.db.models.signals import post_init

from runs import dbvalues
from runs.models import Event, OutboxMessage, Run
from toolcalls import sql as toolcalls_sql
from toolcalls.models import Attempt, E, Receipt, ToolCall, V

pytestmark = pytest.mark.django_db
MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
# Defaults drawn afresh by each instance: new ids (compared by their prefix), the time now.
FRESH = {"id", "external_request_id"}
NOW = {"status_since"}


def _same_instance(mine: Any, orm: Any) -> None:
    assert type(mine) is type(orm)
    assert list(mine.__dict__) == list(orm.__dict__)  # the same attributes, set in order
    for name, value in orm.__dict__.items():
        if name == "_state":
            continue
        if name in FRESH:
            assert mine.__dict__[name].split("_")[0] == value.split("_")[0]
        elif name in NOW:
            assert abs((mine.__dict__[name] - value).total_seconds()) < 5
        else:
            assert mine.__dict__[name] == value and type(mine.__dict__[name]) is type(value)
    assert (mine._state.adding, mine._state.db) == (orm._state.adding, orm._state.db)
    assert mine._state.adding
    assert mine._state.fields_cache.keys() == orm._state.fields_cache.keys()
    for name, cached in orm._state.fields_cache.items():
        assert mine._state.fields_cache[name] is cached


def _event_values(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.pk,
        "seq": 7,
        "event_type": "test.made",
        "schema_version": 1,
        "producer": "test",
        "tenant_id": run.tenant_id,
        "actor": "user:alice",
        "tool_call_id": "tc_x",
        "occurred_at": MOMENT,
        "recorded_at": MOMENT,
        "payload": {"a": [1, {"b": None}]},
        "prev_hash": "0" * 64,
    }


def test_an_event_is_the_one_init_makes(run: Run) -> None:
    values = _event_values(run)
    _same_instance(dbvalues.new(Event, dict(values)), Event(**values))


def test_an_outbox_message_takes_its_defaults_as_init_does() -> None:
    values = {"task": "t", "args": ["a", 1], "available_at": MOMENT, "traceparent": None}
    mine = dbvalues.new(OutboxMessage, dict(values))
    _same_instance(mine, OutboxMessage(**values))
    assert mine.published_count == 0 and mine.done_at is None


def test_a_call_caches_its_related_objects_and_guards_its_statuses(run: Run) -> None:
    values = {
        "tenant": run.tenant,
        "run": run,
        "capability_id": "refund-order-v2",
        "decision": None,
        "intent": "i",
        "object_ref": "order:o-1",
        "object_revision": None,
        "args": {"order_id": "o-1"},
        "args_digest": "d" * 64,
        "idempotency_key": "k",
        "external_request_id": "req_given",
        "compensation_of": None,
    }
    mine, orm = dbvalues.new(ToolCall, dict(values)), ToolCall(**values)
    _same_instance(mine, orm)
    assert mine.run is run and mine.tenant is run.tenant
    assert (mine.execution_status, mine.verification_status) == (E.PROPOSED, V.NOT_OBSERVED)
    for call in (mine, orm):  # set through django-fsm's descriptor: protected from now on
        with pytest.raises(AttributeError, match="modification is not allowed"):
            call.execution_status = E.AUTHORIZED


def test_an_init_listener_gets_its_signal(run: Run) -> None:
    seen: list[Any] = []

    def listen(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(listen, sender=Event)
    try:
        made = dbvalues.new(Event, _event_values(run))
    finally:
        post_init.disconnect(listen, sender=Event)
    assert seen == [made]


def test_names_init_treats_otherwise_are_left_to_it(run: Run) -> None:
    with pytest.raises(TypeError, match="unexpected keyword arguments: 'colour'"):
        dbvalues.new(Event, {**_event_values(run), "colour": "red"})
    # A relation given by name and by attname: __init__ sets both, the attname last.
    both = dbvalues.new(Event, {**_event_values(run), "run": run, "run_id": "run_other"})
    assert both.run_id == "run_other"


class Level(enum.IntEnum):
    HIGH = 3


def test_a_row_with_status_members_is_prepared_as_the_orm_prepares_it(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statuses as TextChoices members (a new call's defaults, a transition's targets) keep
    the row on the plain path, with the ORM's parameters; an IntEnum is still made an int."""
    call = dbvalues.new(
        ToolCall,
        {
            "tenant": run.tenant,
            "run": run,
            "capability_id": "refund-order-v2",
            "intent": "i",
            "object_ref": "order:o-1",
            "args": {"order_id": "o-1"},
            "args_digest": "d" * 64,
            "idempotency_key": "k",
            "fencing_token": Level.HIGH,
        },
    )
    monkeypatch.setattr("django.utils.timezone.now", lambda: MOMENT)  # the auto dates
    plan = dbvalues.plan(ToolCall, connection)
    columns = plan.columns(plan.every, True)
    statuses = [
        i
        for i, f in enumerate(plan.fields)
        if f.name in ("execution_status", "verification_status")
    ]
    values = columns.raw(call)
    assert [type(values[i]) for i in statuses] == [E, V]
    mine = toolcalls_sql.call_values(call)
    orm = [f.get_db_prep_save(f.pre_save(call, True), connection) for f in plan.fields]
    assert [type(v) for v in mine] == [type(v) for v in orm]
    assert [getattr(v, "obj", v) for v in mine] == [getattr(v, "obj", v) for v in orm]
    call.fencing_token = 0
    assert columns.plain(columns.raw(call))  # the members do not send it to the field path


# Made without a database (helper C's checks, merged): defaults made per instance, another
# model, a name that is no field's.
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


def _same_plain(mine: Any, theirs: Any) -> None:
    assert type(mine) is type(theirs)
    assert list(mine.__dict__) == list(theirs.__dict__)  # the same attributes, in field order
    assert _attributes(mine) == _attributes(theirs)
    assert (mine._state.adding, mine._state.db) == (theirs._state.adding, theirs._state.db)
    assert mine._state.fields_cache == theirs._state.fields_cache == {}


def test_a_default_that_is_made_each_time_is_made_for_each_instance() -> None:
    values = {k: v for k, v in EVENT.items() if k != "id"}
    first, second = dbvalues.new(Event, values), dbvalues.new(Event, values)
    assert first.id.startswith("evt_") and second.id.startswith("evt_")
    assert first.id != second.id
    # Everything else as the constructor gives it.
    _same_plain(
        dbvalues.new(Event, {**values, "id": first.id}), Event(**{**values, "id": first.id})
    )


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (OutboxMessage, {"task": "toolcalls.dispatch", "args": ["tc_x"], "available_at": MOMENT}),
        (
            Attempt,
            {"tool_call_id": "tc_x", "run_id": "run_x", "number": 2, "fencing_token": 2},
        ),
        (
            Receipt,
            {
                "tool_call_id": "tc_x",
                "attempt_id": "att_x",
                "external_id": "re_1",
                "status": "succeeded",
                "source": "dispatch",
                "raw_response": {"id": "re_1", "amount": 2500},
            },
        ),
    ],
)
def test_other_models_take_every_default_the_constructor_takes(
    model: Any, values: dict[str, Any]
) -> None:
    mine = dbvalues.new(model, dict(values))
    theirs = model(**values, id=mine.id)
    _same_plain(mine, theirs)


def test_a_name_that_is_no_fields_is_refused_as_the_constructor_refuses_it() -> None:
    with pytest.raises(TypeError, match="unexpected keyword"):
        dbvalues.new(Event, {**EVENT, "not_a_field": 1})
