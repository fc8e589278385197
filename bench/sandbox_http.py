"""The benchmarks' requests to the sandbox (the simulated external systems, sandbox/): the
orders their calls refund, and the payment ledger their invariant counts."""

from __future__ import annotations

from typing import Any

import httpx

from bench.driver import FIRST_ORDER, TENANT


def add_orders(
    sandbox_url: str, count: int, *, first: int = FIRST_ORDER, captured_cents: int = 100
) -> None:
    """`count` fresh orders from `order-<first>` on, one per call, so that no answer of the
    sandbox (an order lists its refunds) grows as a run goes on."""
    body = {"tenant": TENANT, "first": first, "count": count, "captured_cents": captured_cents}
    httpx.post(f"{sandbox_url}/orders", json=body, timeout=60).raise_for_status()


def ledger(sandbox_url: str) -> list[dict[str, Any]]:
    """The payment gateway's effects: one per call made, whatever the retries."""
    response = httpx.get(f"{sandbox_url}/ledger", params={"system": "payments"}, timeout=60)
    return response.json()["effects"]
