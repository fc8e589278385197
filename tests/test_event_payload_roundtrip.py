"""runs.events.rfc8785_roundtrip gives every payload what a JSON round trip through RFC 8785
gives it (what the database returns, hence what the hash covers), whether it takes the copy
for flat payloads or the round trip itself."""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any

import pytest
import rfc8785
from django.db import transaction

from runs import events
from runs.models import Run
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
    got = events.rfc8785_roundtrip(payload)
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
