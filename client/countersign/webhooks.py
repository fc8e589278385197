"""Checking a webhook from Countersign before trusting it.

    from countersign import verify_webhook, WebhookVerificationError

    event = verify_webhook(request.body, request.headers, secret)   # raises if not genuine
    if event["type"] == "tool_call.terminal": ...

Countersign signs each delivery: header `Countersign-Signature: t=<unix seconds>,v1=<hex>`,
where the hex is HMAC-SHA256 with the webhook's secret over `"<t>." + body` (the raw bytes).
A delivery may be sent more than once (it is retried until answered with a 2xx): dedupe by
the event's `id`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

SIGNATURE_HEADER = "Countersign-Signature"


class WebhookVerificationError(Exception):
    """The delivery is not genuine, or too old: do not act on it."""


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        # Plain dicts are case-sensitive; frameworks' header mappings usually are not.
        value = next((v for k, v in headers.items() if k.lower() == name.lower()), None)
    return value


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp, signatures = None, []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookVerificationError(
                    "The signature's timestamp is not a number."
                ) from None
        elif key == "v1" and value:
            signatures.append(value)
    if timestamp is None or not signatures:
        raise WebhookVerificationError(f"{SIGNATURE_HEADER} needs t=<unix>,v1=<hex>.")
    return timestamp, signatures


def verify_webhook(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str,
    tolerance: float = 300,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """Check the signature of a delivery and that it was signed at most `tolerance` seconds
    from now (a replayed old delivery is refused); return the parsed event. Raises
    WebhookVerificationError otherwise."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    header = _header(headers, SIGNATURE_HEADER)
    if not header:
        raise WebhookVerificationError(f"No {SIGNATURE_HEADER} header.")
    timestamp, signatures = _parse(header)
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > tolerance:
        raise WebhookVerificationError(
            f"Signed {int(age)} s from now, outside the tolerance of {int(tolerance)} s."
        )
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256)
    if not any(hmac.compare_digest(expected.hexdigest(), s) for s in signatures):
        raise WebhookVerificationError("The signature does not match this body and secret.")
    try:
        return json.loads(raw)
    except ValueError:
        raise WebhookVerificationError("The body is not JSON.") from None
