"""Send and classify (DESIGN section 6): call the external system once, with the call's
idempotency key and request id, and say what the answer proves. No database here: the claim
before and the record after are toolcalls/dispatch.py's transactions."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from toolcalls import capabilities, connectors, errors, keepalive
from toolcalls.writes import timeout_of

if TYPE_CHECKING:
    from toolcalls.dispatch import Claim


@dataclass
class Outcome:
    kind: str  # confirmed | rejected | retryable | unknown
    error_name: str = ""
    message: str = ""
    http_status: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    replayed: bool = False


def send(claim: Claim) -> Outcome:
    """Call the external system once, and say what the answer proves."""
    capability = claim.capability
    request = capability.build_request(claim.args)
    headers = {"X-Request-Id": claim.external_request_id}
    if capability.kind == "write":
        headers["Idempotency-Key"] = claim.idempotency_key
    endpoint = connectors.endpoint_for(claim.tenant_slug, capability.system)
    try:
        answer = connectors.write(
            endpoint,
            request.method,
            request.path,
            json=request.body,
            headers=headers,
            timeout=timeout_of(capability),
        )
    # Each rule names the kept-alive transport's error and httpx's (a traced process) alike.
    except (
        keepalive.NotSent,
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
    ) as exc:
        # The connection never opened: nothing was sent.
        return Outcome("retryable", errors.UNREACHABLE, f"{type(exc).__name__}: {exc}")
    except (keepalive.NoAnswerInTime, httpx.TimeoutException) as exc:
        return Outcome("unknown", errors.TIMEOUT, f"no answer in time ({type(exc).__name__})")
    except (keepalive.AnswerLost, httpx.TransportError) as exc:
        # Sent, then the connection broke: the system may have done it.
        return Outcome("unknown", errors.CONNECTION_LOST, f"{type(exc).__name__}: {exc}")
    return classify(answer)


def classify(answer: keepalive.Answer) -> Outcome:
    status = answer.status
    try:
        body = answer.json()
    except ValueError:
        body = {"text": answer.body.decode("utf-8", "replace")[:500]}
    if not isinstance(body, dict):
        body = {"value": body}
    remote = f"{status} {body.get('error', '')}: {body.get('message', '')}".strip()
    if 200 <= status < 300:
        replayed = answer.header("Idempotent-Replayed").lower() == "true"
        return Outcome("confirmed", http_status=status, body=body, replayed=replayed)
    if status == 429:
        retry_after = answer.header("Retry-After")
        return Outcome(
            "retryable",
            errors.RATE_LIMITED,
            remote,
            status,
            retry_after=float(retry_after) if retry_after.isdigit() else None,
        )
    if status in (502, 503):
        # The gateway or the service refused before processing: safe to send again.
        return Outcome("retryable", errors.UPSTREAM_5XX, remote, status)
    if status >= 500:
        # A 500 or 504 may come after the work was done.
        return Outcome("unknown", errors.UPSTREAM_5XX, remote, status)
    if status in (401, 403):
        return Outcome("rejected", errors.AUTH_FAILED, remote, status)
    if status == 400:
        return Outcome("rejected", errors.VALIDATION_FAILED, remote, status)
    return Outcome("rejected", errors.REJECTED, remote, status)


def backoff(policy: capabilities.RetryPolicy, failures: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter, never sooner than the system's Retry-After."""
    ceiling = min(policy.max_delay, policy.base_delay * 2 ** (failures - 1))
    return max(retry_after or 0.0, random.uniform(ceiling / 2, ceiling))
