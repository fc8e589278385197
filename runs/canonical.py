"""Canonical JSON (RFC 8785) and its digest: equal meaning gives equal bytes and hash."""

from __future__ import annotations

from hashlib import sha256
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    return rfc8785.dumps(value)


def digest(value: Any) -> str:
    return sha256(canonical_json(value)).hexdigest()
