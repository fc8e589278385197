"""What an event's payload becomes in the log: the JSON round trip through RFC 8785 that the
database's jsonb gives it, made without serialising a payload twice where it can (runs/
events.py's append stores this and hashes it; tests/test_event_payload_roundtrip.py)."""

from __future__ import annotations

import json
import operator
from typing import Any

import orjson

from runs.canonical import canonical_json, plain_json


def rfc8785_roundtrip(payload: dict[str, Any]) -> dict[str, Any]:
    return payload_roundtrip(payload)[0]


def payload_roundtrip(payload: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """(what a JSON round trip through RFC 8785 gives `payload`, its canonical bytes when they
    were made on the way: the hash then writes the event around them, compute_hash).

    A flat payload of strings, integers, booleans and nulls (most transitions' events) comes
    back as plain copies of its values, without serialising it twice per event
    (canonicalising was the largest cost of a dispatch batch after its statements;
    profile_dispatch --profile). What JSON cannot carry as it is (an integer past 2**53, a
    lone surrogate) is still refused, by the hash's canonicalisation of the same payload.
    A plain tree (a proposal's payload, with its arguments: dicts with ASCII keys, lists,
    strings, integers within 2**53, booleans, nulls) is canonicalised once, for both, and
    loaded by orjson: what comes back is the same tree, so its canonical form is those bytes.
    A float may not come back the same (a large one comes back an integer, which the hash
    then refuses, as RFC 8785 does): such a payload takes the round trip, and the hash
    canonicalises what came back (tests/test_event_payload_roundtrip.py)."""
    flat = _flat_copy(payload)
    if flat is not None:
        return flat, None
    encoded = plain_json(payload)
    if encoded is None:
        return json.loads(canonical_json(payload)), None
    return orjson.loads(encoded), encoded


def _flat_copy(payload: dict[str, Any]) -> dict[str, Any] | None:
    """What the JSON round trip gives for a flat payload; None for any other."""
    copy: dict[str, Any] = {}
    try:
        ascii_keys = "".join(payload).isascii()  # one test for the keys, not one per key
    except TypeError:  # a key that is not a string
        return None
    for key, value in payload.items():
        if type(key) is not str:
            return None
        if value is None or type(value) in _EXACT:
            copy[key] = value
        elif isinstance(value, str):  # a status (TextChoices): its plain string
            copy[key] = str.__str__(value)
        elif isinstance(value, int):  # an IntEnum: its plain number
            copy[key] = int(value)
        else:
            return None  # a float (2.0 comes back 2), a list, an object: the round trip
    # In RFC 8785's order of keys (by UTF-16 code units), as the round trip leaves them:
    # for ASCII keys (every transition's) the order of the strings themselves.
    if ascii_keys:
        return dict(sorted(copy.items(), key=_first))
    return dict(sorted(copy.items(), key=lambda item: item[0].encode("utf-16-be")))


_EXACT = (str, int, bool)
_first = operator.itemgetter(0)
