"""Capability contracts: the machinery in `base`, one module of contracts per external system.

Importing this package registers every contract; `get(id)` and `REGISTRY` read them.
"""

from __future__ import annotations

from toolcalls.capabilities import carrier, mailer, payments, warehouse  # noqa: F401 (register)
from toolcalls.capabilities.base import (
    REGISTRY,
    Capability,
    Problems,
    Request,
    RetryPolicy,
    TrustedData,
    UpstreamUnavailable,
    get,
    register,
)

__all__ = [
    "REGISTRY",
    "Capability",
    "Problems",
    "Request",
    "RetryPolicy",
    "TrustedData",
    "UpstreamUnavailable",
    "get",
    "register",
]
