"""Canonical JSON (RFC 8785) and its digest: equal meaning gives equal bytes and hash."""

from __future__ import annotations

import math
from hashlib import sha256
from typing import Any

import rfc8785

# RFC 8785 carries integers only within ±(2**53 - 1), the integers a double holds exactly.
MAX_SAFE_INTEGER = 2**53 - 1


def canonical_json(value: Any) -> bytes:
    return rfc8785.dumps(value)


def digest(value: Any) -> str:
    return sha256(canonical_json(value)).hexdigest()


def number_problem(value: int | float) -> str | None:
    """Why a number cannot make the round trip through PostgreSQL and back into canonical
    JSON, or None when it can.

    A float is held to the integer bound too: jsonb keeps numbers as exact decimals and gives
    a large float back as an integer (1e300 comes back with 301 digits), which RFC 8785 then
    refuses. Every float at or past 2**53 is a whole number, so the same bound covers both."""
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number (NaN or infinity)"
    if abs(value) > MAX_SAFE_INTEGER:
        return f"is beyond ±{MAX_SAFE_INTEGER} (2**53 - 1), the range canonical JSON carries"
    return None
