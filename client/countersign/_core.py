"""What the sync and the async client share: the requests of the API, when to send one again,
and how an answer becomes a result or a `CountersignError`.

Retries: a request that never reached the server (the connection did not open) is sent again,
whatever it is. One that may have reached it (the connection broke, the answer timed out) is
sent again only when doing it twice is the same as once: reads, and the POSTs Countersign
deduplicates (a run by its Idempotency-Key or external_ref, a proposal by its intent, cancel,
stop, compensate, the policy dry run). Every POST carries an `Idempotency-Key`, the same on
each of its retries. A 503 `database.busy` wrote nothing and is sent again after its
Retry-After.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

API_PREFIX = "/api/v1"
# The server holds a `?wait=` at most this long.
MAX_WAIT_SECONDS = 30
# Added to a long poll's own wait for the HTTP timeout.
WAIT_MARGIN_SECONDS = 10


class CountersignError(Exception):
    """The API refused a request; `name` is the stable dotted error name
    (`idempotency.conflict`, `tool_call.already_dispatched` …)."""

    def __init__(self, status: int, name: str, message: str, details: list[Any]) -> None:
        super().__init__(f"{status} {name}: {message}")
        self.status = status
        self.name = name
        self.message = message
        self.details = details


@dataclass
class Request:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Sending it twice is the same as once: it may be retried after the connection broke.
    repeatable: bool = True
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.method == "POST":
            # One key per logical request, the same on every retry of it.
            self.headers.setdefault("Idempotency-Key", uuid.uuid4().hex)


def backoff(attempt: int) -> float:
    return min(0.25 * 2**attempt, 4.0) * random.uniform(0.5, 1.0)


def delay_after_error(exc: httpx.TransportError, request: Request, attempt: int, limit: int):
    """Seconds to wait before sending `request` again after a transport error; None: raise."""
    if attempt >= limit:
        return None
    never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    if never_sent or request.repeatable:
        return backoff(attempt)
    return None


def delay_after_response(response: httpx.Response, attempt: int, limit: int) -> float | None:
    if response.status_code != 503 or attempt >= limit:
        return None
    try:
        return min(float(response.headers.get("Retry-After", "1")), 10.0)
    except ValueError:
        return backoff(attempt)


def result_of(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = {"name": "http.error", "message": response.text[:200], "details": []}
        raise CountersignError(
            response.status_code, error["name"], error["message"], error.get("details", [])
        )
    return response.json()


# --- the API's requests -----------------------------------------------------------------------


def start_run(
    title: str,
    *,
    idempotency_key: str | None,
    external_ref: str | None,
    fields: dict[str, Any],
) -> Request:
    body = {"title": title, **fields}
    if external_ref is not None:
        body["external_ref"] = external_ref
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Request("POST", "/runs", body, headers=headers)


def propose(
    run_id: str,
    capability: str,
    args: dict[str, Any],
    *,
    intent: str,
    decision_id: str | None,
    object_ref: str,
    object_revision: int | None,
    depends_on: list[str] | None,
) -> Request:
    body: dict[str, Any] = {"capability": capability, "args": args, "intent": intent}
    if depends_on:
        body["depends_on"] = depends_on
    if decision_id:
        body["decision_id"] = decision_id
    if object_ref or object_revision is not None:
        body["object"] = {"ref": object_ref, "revision": object_revision}
    return Request("POST", f"/runs/{run_id}/tool-calls", body)


def get_tool_call(tool_call_id: str, wait: float, since: str) -> Request:
    wait = max(0.0, min(wait, MAX_WAIT_SECONDS))
    params: dict[str, Any] = {"wait": round(wait, 3)} if wait else {}
    if since:
        params["since"] = since
    timeout = wait + WAIT_MARGIN_SECONDS if wait else None
    return Request("GET", f"/tool-calls/{tool_call_id}", params=params, timeout=timeout)


def record_decision(
    run_id: str, kind: str, content: dict[str, Any], supersedes: str | None, turn_id: str
) -> Request:
    body = {"kind": kind, "content": content, "supersedes": supersedes, "turn_id": turn_id}
    # Not deduplicated by the server: twice would record two decisions.
    return Request("POST", f"/runs/{run_id}/decisions", body, repeatable=False)


def finish_run(run_id: str, failed_permanently: bool, reason: str) -> Request:
    body = {"failed_permanently": failed_permanently, "reason": reason}
    return Request("POST", f"/runs/{run_id}/complete", body, repeatable=False)


def retry(tool_call_id: str) -> Request:
    return Request("POST", f"/tool-calls/{tool_call_id}/retry", repeatable=False)


def mint_credential(run_id: str, ttl_s: int, scopes: list[str] | None) -> Request:
    """A run-scoped credential. Not repeated after a lost answer: the token of a credential
    minted then is gone, and a second would be minted."""
    body: dict[str, Any] = {"ttl_s": ttl_s}
    if scopes is not None:
        body["scopes"] = list(scopes)
    return Request("POST", f"/runs/{run_id}/credentials", body, repeatable=False)
