"""Canonical JSON (RFC 8785) and its digest: equal meaning gives equal bytes and hash."""

from __future__ import annotations

import math
from hashlib import sha256
from typing import Any

import orjson
import rfc8785

# RFC 8785 carries integers only within ±(2**53 - 1), the integers a double holds exactly.
MAX_SAFE_INTEGER = 2**53 - 1


# orjson writes what RFC 8785 writes for a tree of dicts with ASCII keys, lists, strings,
# integers within RFC 8785's range (OPT_STRICT_INTEGER refuses the others), booleans and
# nulls: keys sorted (ASCII, so by UTF-16 code units too), no whitespace, strings as they
# are but for the same escapes (quote, backslash, \b \f \n \r \t, \u00xx for the other
# controls). Floats, other key characters or types, and whatever orjson refuses (a lone
# surrogate, deep nesting) take rfc8785 itself, which gives the bytes or the error.
# tests/test_canonical_json.py compares the two over generated trees. rfc8785 is pure Python:
# it was an eighth of a proposal's CPU (profile_propose --profile: each event's hash, the
# payload's round trip, the arguments' digest).
_FAST = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER


def canonical_json(value: Any) -> bytes:
    encoded = plain_json(value)
    return encoded if encoded is not None else rfc8785.dumps(value)


def plain_json(value: Any) -> bytes | None:
    """The canonical JSON of a plain tree (what orjson writes as RFC 8785 does), or None for
    any other value."""
    try:
        if _plain(value):
            return orjson.dumps(value, option=_FAST)
    except (RecursionError, orjson.JSONEncodeError):
        pass
    return None


def _plain(value: Any) -> bool:
    """Whether `value` is made only of what orjson and RFC 8785 write alike (exact types:
    a subclass, an enum's member say, takes the exact path)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is dict:
        # The keys' characters in one test rather than one per key (an event's body has 19);
        # a key that is not a string makes the join raise.
        try:
            if not "".join(value).isascii():
                return False
        except TypeError:
            return False
        for key, item in value.items():
            if type(key) is not str:  # a str subclass joins too: the exact path takes it
                return False
            # A scalar is decided here rather than by a call: an event's body is a score of
            # them (a call each was most of this check's time; profile_dispatch --profile).
            if type(item) not in _SCALARS and not _plain(item):
                return False
        return True
    if kind is list:
        return all(type(item) in _SCALARS or _plain(item) for item in value)
    return False


# The exact types `_plain` takes as they are (None's too).
_SCALARS = frozenset({str, int, bool, type(None)})


def canonical_json_around(value: dict[str, Any], key: str, encoded: bytes) -> bytes:
    """`canonical_json(value)`, given `encoded`, the canonical JSON of `value[key]`, made
    already (an event's payload, canonicalised for its round trip): the rest of `value` is
    written around those bytes instead of the member being walked and written a second time.
    The same bytes: RFC 8785 writes an object as its members in key order, each its key and
    its value's own canonical form, and orjson puts the fragment in its key's place."""
    rest = dict(value)
    del rest[key]
    try:
        if key.isascii() and _plain(rest):
            rest[key] = orjson.Fragment(encoded)
            return orjson.dumps(rest, option=_FAST)
    except (RecursionError, orjson.JSONEncodeError):
        pass
    return canonical_json(value)


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
