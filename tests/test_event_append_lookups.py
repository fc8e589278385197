"""What `runs.events.append` looks up per event (profile_dispatch: a dispatched call appends
five): a transition's event takes the moment the transition read from the clock, an open
batch's events use the connection the batch was opened on, and the hash's body and checks
make no call per column or per key."""

from __future__ import annotations

import cProfile
import pstats
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from runs import canonical, events, roundtrip
from runs.models import Event, Run
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall
from toolcalls.writes import tool_call_lock, tool_call_transition

pytestmark = pytest.mark.django_db


def _count_clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    readings: list[int] = []

    def now() -> Any:
        readings.append(1)
        return timezone.now()

    monkeypatch.setattr(events, "timezone", SimpleNamespace(now=now))
    return readings


def test_a_transitions_event_is_at_the_transitions_moment(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = propose_in(run, intent="clock")
    readings = _count_clock(monkeypatch)
    with transaction.atomic():
        locked = tool_call_lock(call.pk)
        assert locked is not None
        tool_call_transition(locked, "cancel", actor="test", producer="test", reason="r")
    assert readings == []  # the append read no clock of its own
    event = Event.objects.filter(tool_call_id=call.pk).order_by("-seq").first()
    assert event is not None and event.event_type == "tool_call.cancelled"
    status_since = ToolCall.objects.get(pk=call.pk).status_since
    assert event.occurred_at == event.recorded_at == status_since
    assert events.verify_chain(Event.objects.filter(run=run).order_by("seq")) == []


def test_an_event_without_a_moment_reads_the_clock(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = _count_clock(monkeypatch)
    with transaction.atomic():
        event = events.append(
            run=run, event_type="run.waiting", payload={"from": "a", "to": "b"}, producer="t"
        )
    assert readings == [1]
    assert event.recorded_at == event.occurred_at


class _CountingConnections:
    def __init__(self) -> None:
        self.lookups = 0

    def __getitem__(self, alias: str) -> Any:
        self.lookups += 1
        return connections[alias]


def test_a_batch_looks_its_connection_up_once(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _CountingConnections()
    monkeypatch.setattr(events, "connections", counting)
    with transaction.atomic(), events.batch():
        for n in range(4):
            events.append(
                run=run, event_type="run.waiting", payload={"from": f"{n}", "to": "b"}, producer="t"
            )
    assert counting.lookups == 1  # when the batch opened, not once per event
    assert Event.objects.filter(run=run, event_type="run.waiting").count() == 4
    assert events.verify_chain(Event.objects.filter(run=run).order_by("seq")) == []


def _calls(function: Any, *args: Any) -> tuple[Any, int]:
    profile = cProfile.Profile()
    result = profile.runcall(function, *args)
    return result, pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def test_an_events_body_is_read_from_its_values(run: Run) -> None:
    with transaction.atomic():
        event = events.append(
            run=run, event_type="run.waiting", payload={"from": "a", "to": "b"}, producer="t"
        )
    body, calls = _calls(events.event_body, event)
    # The body itself, one iso() (three calls) for both times: no descriptor per column.
    assert calls <= 6  # before: 10
    stored = Event.objects.get(pk=event.pk)
    deferred = Event.objects.defer("payload", "tenant").get(pk=event.pk)
    assert events.event_body(stored) == events.event_body(deferred) == body
    assert events.compute_hash(deferred) == event.hash


def test_canonical_json_checks_a_dicts_keys_in_one_step() -> None:
    body = {f"key_{n}": n for n in range(19)} | {"payload": {"from": "a", "to": "b"}}
    plain, calls = _calls(canonical._plain, body)
    assert plain
    assert calls <= 10  # not one isascii per key (before: 27)


def test_a_flat_payloads_copy_checks_its_keys_in_one_step() -> None:
    payload = {f"key_{n}": "v" for n in range(12)}
    (copy, encoded), calls = _calls(roundtrip.payload_roundtrip, payload)
    assert copy == dict(sorted(payload.items())) and encoded is None  # the flat path
    assert calls <= 8  # not one isascii per key (before: 18)


def test_a_rows_changed_columns_are_found_without_a_call_per_column(
    run: Run, sandbox: Sandbox
) -> None:
    call = ToolCall.objects.get(pk=propose_in(run, intent="changed").pk)
    call.intent = "changed again"
    names, calls = _calls(call.changed_fields)
    assert names == ["intent", "updated_at"]
    assert calls <= 10  # before: 37, a dict.get per column (27 of them)
