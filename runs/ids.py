"""Opaque, prefixed, time-sortable ids for everything that leaves the system.

`run_01JD3M8Z2Q4W6Y8A0C2E4G6J8K`: a prefix, then 26 Crockford base32 characters (48 bits of
milliseconds since the epoch, then 80 random bits), as in ULID. They sort by creation time as
strings, say what they name, and reveal nothing else.
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    millis = time.time_ns() // 1_000_000
    return f"{prefix}_{_encode(millis, 10)}{_encode(secrets.randbits(80), 16)}"


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
