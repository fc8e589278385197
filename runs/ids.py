"""Opaque, prefixed, time-sortable ids for everything that leaves the system.

`run_01JD3M8Z2Q4W6Y8A0C2E4G6J8K`: a prefix, then 26 Crockford base32 characters (48 bits of
milliseconds since the epoch, then 80 random bits), as in ULID. They sort by creation time as
strings, say what they name, and reveal nothing else.
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Two characters per 10 bits: 13 look-ups for the 26 characters instead of 26 divmods (a
# proposal makes five ids; the loop was 5 µs of each).
_PAIRS = [first + second for first in _ALPHABET for second in _ALPHABET]
_SHIFTS = tuple(range(120, -10, -10))
_MILLIS_BITS = 2**50 - 1  # the 10 characters of time hold its lowest 50 bits


def new_id(prefix: str) -> str:
    return f"{prefix}_{_characters(time.time_ns() // 1_000_000, secrets.randbits(80))}"


def _characters(millis: int, random: int) -> str:
    """The 26 characters: 10 of `millis`, then 16 of the 80 random bits (tests/test_ids.py
    checks them digit by digit)."""
    value = (millis & _MILLIS_BITS) << 80 | random
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


# One place that lists every prefix, so that the same prefix never names two things.
PREFIXES = {
    "run": "run",
    "decision": "dec",
    "event": "evt",
    "api_key": "key",
    "tool_call": "tc",
    "attempt": "att",
    "receipt": "rcp",
    "approval": "apr",
    "outbox": "obx",
    "webhook": "whk",
    "webhook_delivery": "whd",
    "checkpoint": "ckpt",
    "feedback": "fb",
    "run_credential": "rcr",
}
