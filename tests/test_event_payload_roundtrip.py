"""runs.roundtrip.rfc8785_roundtrip gives every payload what a JSON round trip through RFC 8785
gives it (what the database returns, hence what the hash covers), whether it takes the copy
for flat payloads or the round trip itself; a payload canonicalised once for both its round
trip and the event's hash (payload_roundtrip, compute_hash's `encoded_payload`) is stored and
hashed as when it was canonicalised twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

import pytest
import rfc8785
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from runs import events, roundtrip
from runs.canonical import canonical_json, canonical_json_around
from runs.models import Event, Run
from toolcalls.models import Execution


class Level(IntEnum):
    HIGH = 3


PAYLOADS: list[dict[str, Any]] = [
    {},
    {"from": Execution.ACCEPTED, "to": Execution.COMPLETED, "reason": 'é ✓ "q"'},
    {"attempt": 2, "fencing_token": Level.HIGH, "ok": True, "no": False, "none": None},
    {"delay_seconds": 2.0, "fraction": 0.1},  # floats: 2.0 comes back 2
    {"nested": {"b": [1, 2.5, None], "a": "x"}, "list": [Execution.FAILED]},
    {"b": 1, "a": 2, "é": 3, "Z": 4, "\U0001f600": 5, "\uff61": 6},  # RFC 8785's key order
    {"to": "x", "from": "y", "_": 1, "Z": 2, "a1": 3, "a": None, "~": True},  # ASCII keys
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_payload_is_what_the_round_trip_gives(payload: dict[str, Any]) -> None:
    expected = json.loads(rfc8785.dumps(payload))
    got = roundtrip.rfc8785_roundtrip(payload)
    assert got == expected
    # Plain values, as json.loads makes them: no status enum or IntEnum left in the payload.
    assert list(got) == list(expected)  # the same order of keys
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]
    assert got is not payload


@pytest.mark.django_db
def test_a_number_json_cannot_carry_is_still_refused(run: Run) -> None:
    with pytest.raises(rfc8785.IntegerDomainError), transaction.atomic():
        events.append(
            run=run,
            event_type="tool_call.looked_up",
            payload={"found": False, "lookup": 2**60},
            producer="test",
        )


# --- a payload that is not flat: canonicalised once, for its round trip and for the hash ------

_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
_NUMBERS = st.one_of(
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([0.1, 2.0, -0.0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308]),
)
_KEYS = st.one_of(_TEXT, st.sampled_from(["a", "é", "\U0001f600", "\ufb01", "payload", ""]))
_TREES = st.recursive(
    st.one_of(st.none(), st.booleans(), _NUMBERS, _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=16,
)


def _old_roundtrip_and_hash(event: Event, payload: dict[str, Any]) -> tuple[str, str]:
    """What append stored and hashed before: the payload canonicalised and loaded by json,
    then the whole body canonicalised again (repr: 1, 1.0 and True are told apart)."""
    stored = json.loads(canonical_json(payload))
    body = {**events.event_body(event), "payload": stored}
    return repr(stored), events.hash_body(body)


def _event(payload: dict[str, Any]) -> Event:
    moment = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
    return Event(
        id="ev_1",
        run_id="run_1",
        seq=3,
        event_type="tool_call.proposed",
        schema_version=1,
        producer="api",
        tenant_id=7,
        actor="agent:é",
        tool_call_id="tc_1",
        correlation_id="corr",
        causation_id="",
        occurred_at=moment,
        recorded_at=moment,
        payload=payload,
        prev_hash="a" * 64,
    )


@hyp_settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _TREES, max_size=5))
def test_a_payload_canonicalised_once_is_stored_and_hashed_as_before(
    payload: dict[str, Any],
) -> None:
    try:
        expected = _old_roundtrip_and_hash(_event(payload), payload)
    except ValueError:  # what RFC 8785 refuses (a lone surrogate, 2.0**53) is refused as before
        with pytest.raises(ValueError):
            stored, encoded = roundtrip.payload_roundtrip(payload)
            events.compute_hash(_event(stored), encoded)
        return
    stored, encoded = roundtrip.payload_roundtrip(payload)
    event = _event(stored)

    assert (repr(stored), events.compute_hash(event, encoded)) == expected
    assert encoded is None or canonical_json(stored) == encoded


@pytest.mark.parametrize(
    "around",
    [
        {"actor": "agent"},
        {"actor": "é ✓", "seq": 2**53 - 1, "none": None},
        {"actor": 1.5},  # not plain: the whole body is written by rfc8785
        {"é": "a key outside ASCII", "z": [1, {"b": 2}]},
    ],
)
def test_the_body_written_around_the_payload_s_bytes_is_the_canonical_body(
    around: dict[str, Any],
) -> None:
    payload = {"args": {"order_id": "o-1", "amount_cents": 1}, "depends_on": [], "x": 0.5}
    body = {**around, "payload": payload}

    assert canonical_json_around(body, "payload", canonical_json(payload)) == canonical_json(body)


@pytest.mark.django_db
def test_a_proposed_event_s_hash_is_the_hash_of_what_the_database_returns(run: Run) -> None:
    payload = {
        "capability": "refund-order-v2",
        "capability_version": 1,
        "args": {"order_id": "order-1", "amount_cents": 250, "currency": "USD", "reason": "é"},
        "args_digest": "d" * 64,
        "idempotency_key": "acme:order-1:refund:i",
        "external_request_id": "req_1",
        "intent": "i",
        "object_ref": "order-1",
        "object_revision": None,
        "compensation_of": None,
        "depends_on": [],
        "summary": "Refund 2.50 USD on order-1",
    }
    with transaction.atomic():
        event = events.append(
            run=run, event_type="tool_call.proposed", payload=payload, producer="api"
        )

    stored = Event.objects.get(pk=event.pk)
    assert stored.payload == event.payload == json.loads(canonical_json(payload))
    assert events.compute_hash(stored) == event.hash == events.hash_body(events.event_body(event))
    assert events.verify_chain(Event.objects.filter(run=run).order_by("seq")) == []
