from __future__ import annotations

import pytest
from django.db import transaction

from runs import events
from runs.events import EventSchemaError
from runs.models import Event, Run, Tenant


@pytest.fixture
def empty_run(tenant: Tenant) -> Run:
    """A run row with nothing in its log yet (the shared `run` has its run.started event)."""
    return Run.objects.create(tenant=tenant, title="t", correlation_id="c-1")


def test_it_refuses_an_unknown_event_type_and_writes_nothing(empty_run: Run) -> None:
    with pytest.raises(EventSchemaError, match="unknown event type"), transaction.atomic():
        events.append(run=empty_run, event_type="run.exploded", payload={}, producer="test")
    assert Event.objects.count() == 0


def test_it_refuses_a_payload_its_schema_rejects_and_writes_nothing(empty_run: Run) -> None:
    with pytest.raises(EventSchemaError, match="title"), transaction.atomic():
        events.append(
            run=empty_run,
            event_type="run.started",
            payload={"title": "", "correlation_id": "c", "max_tool_calls": 0},
            producer="test",
        )
    assert Event.objects.count() == 0


def test_it_refuses_to_append_outside_a_transaction(empty_run: Run) -> None:
    # pytest-django wraps the test in a transaction; this asserts the guard itself.
    transaction.get_connection().in_atomic_block = False
    try:
        with pytest.raises(RuntimeError, match="inside the transaction"):
            events.append(
                run=empty_run,
                event_type="run.cancelled",
                payload={"from": "a", "to": "b"},
                producer="t",
            )
    finally:
        transaction.get_connection().in_atomic_block = True


def test_it_chains_each_event_to_the_previous_one(empty_run: Run) -> None:
    with transaction.atomic():
        first = events.append(
            run=empty_run,
            event_type="run.waiting",
            payload={"from": "active", "to": "waiting"},
            producer="test",
        )
        second = events.append(
            run=empty_run,
            event_type="run.resumed",
            payload={"from": "waiting", "to": "active"},
            producer="test",
        )
    assert (first.seq, second.seq) == (1, 2)
    assert first.prev_hash == events.GENESIS_HASH
    assert second.prev_hash == first.hash
    assert events.verify_chain([first, second]) == []
    stored = list(Event.objects.order_by("seq"))
    assert events.verify_chain(stored) == []


def test_it_upcasts_old_versions_for_replay() -> None:
    events.register("test.widget_moved", 1, {"type": "object", "required": ["to"]})
    events.register("test.widget_moved", 2, {"type": "object", "required": ["to", "from"]})
    events.register_upcaster("test.widget_moved", 1, lambda p: {**p, "from": "unknown"})
    assert events.upcast("test.widget_moved", 1, {"to": "shelf"}) == (
        2,
        {"to": "shelf", "from": "unknown"},
    )
    assert events.latest_version("test.widget_moved") == 2
