"""Fault injection: every fault observed from the client side and checked against the ledger."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.sandbox_process import Sandbox

REFUND = {"order_id": "order-001", "amount_cents": 1000, "currency": "USD"}
DISCONNECTED = (httpx.RemoteProtocolError, httpx.ReadError)


def lookup(sandbox: Sandbox, request_id: str) -> httpx.Response:
    return sandbox.get("payments", "/refunds/lookup", {"request_id": request_id})


def test_drop_response_after_commit(sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0)
    with pytest.raises(DISCONNECTED):
        sandbox.post("payments", "/refunds", REFUND, request_id="lost-answer", key="k1")
    [effect] = sandbox.ledger()
    assert (effect["operation"], effect["request_id"]) == ("refund.create", "lost-answer")
    assert lookup(sandbox, "lost-answer").status_code == 200

    # The retry with the same key replays the committed refund instead of refunding twice.
    sandbox.client.delete("/faults")
    retry = sandbox.post("payments", "/refunds", REFUND, request_id="lost-answer", key="k1")
    assert retry.status_code == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json()["refund_id"] == effect["resource_id"]
    assert len(sandbox.ledger()) == 1


def test_drop_request_before_commit(sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", drop_request_before_commit=1.0)
    with pytest.raises(DISCONNECTED):
        sandbox.post("payments", "/refunds", REFUND, request_id="never-arrived")
    assert sandbox.ledger() == []
    assert lookup(sandbox, "never-arrived").status_code == 404
    assert sandbox.order("order-001")["refunded_cents"] == 0


def test_http_429_with_retry_after_applies_times_requests(sandbox: Sandbox) -> None:
    faults = sandbox.faults(system="payments", http_429=1.0, retry_after=2, times=1)
    assert faults["payments"]["faults"]["http_429"]["remaining"] == 1
    limited = sandbox.post("payments", "/refunds", REFUND, request_id="r1")
    assert limited.status_code == 429
    assert limited.headers["Retry-After"] == "2"
    assert limited.json()["error"] == "rate_limited"
    assert sandbox.ledger() == []

    retried = sandbox.post("payments", "/refunds", REFUND, request_id="r1")
    assert retried.status_code == 201
    assert sandbox.client.get("/faults").json()["payments"]["faults"] == {}
    assert len(sandbox.ledger()) == 1


def test_http_5xx_commits_nothing_and_spares_reads(sandbox: Sandbox) -> None:
    sandbox.faults(system="*", http_5xx=1.0)
    failed = sandbox.post("payments", "/refunds", REFUND, request_id="r5")
    assert failed.status_code == 503
    assert failed.json()["error"] == "service_unavailable"
    email = {"to": "a@example.com", "subject": "s", "body": "b"}
    assert sandbox.post("mailer", "/emails", email).status_code == 503
    assert sandbox.ledger() == []
    assert lookup(sandbox, "r5").status_code == 404  # GETs are not faulted
    assert sandbox.order("order-001")["refunded_cents"] == 0


def test_http_401_fault_rejects_a_valid_token(sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", http_401=1.0, times=1)
    rejected = sandbox.post("payments", "/refunds", REFUND)
    assert rejected.status_code == 401
    assert rejected.json()["error"] == "auth_failed"
    assert sandbox.post("payments", "/refunds", REFUND).status_code == 201


def test_delay_response_commits_then_holds_the_answer(sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=3)
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        sandbox.post("payments", "/refunds", REFUND, request_id="slow", timeout=0.5)
    assert time.monotonic() - started < 2
    [effect] = sandbox.ledger()
    assert effect["request_id"] == "slow"
    assert sandbox.order("order-001")["refunded_cents"] == 1000


def test_faults_are_per_system(sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", http_5xx=1.0)
    body = {"order_id": "order-001", "address_id": "addr-001"}
    assert sandbox.post("carrier", "/waybills", body).status_code == 201
    sandbox.client.delete("/faults", params={"system": "payments"})
    assert sandbox.post("payments", "/refunds", REFUND).status_code == 201


@pytest.mark.parametrize(
    "spec",
    [
        {"system": "bank", "http_5xx": 1.0},
        {"system": "payments", "http_5xx": 1.5},
        {"system": "payments", "http_5xx": 1.0, "times": 0},
        {"system": "payments", "retry_after": 3},
        {"system": "payments", "typo_fault": 1.0},
    ],
)
def test_invalid_fault_specs_are_rejected(sandbox: Sandbox, spec: dict[str, Any]) -> None:
    response = sandbox.client.post("/faults", json=spec)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert all(state["faults"] == {} for state in sandbox.client.get("/faults").json().values())
