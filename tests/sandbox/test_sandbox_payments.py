"""Seed data, payments refunds, look-ups, auth and idempotency."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from tests.sandbox_process import Sandbox


def refund(order_id: str = "order-001", amount_cents: int = 1000) -> dict[str, Any]:
    return {"order_id": order_id, "amount_cents": amount_cents, "currency": "USD"}


def test_seed_data_is_deterministic(sandbox: Sandbox) -> None:
    data = sandbox.client.get("/data").json()
    orders = {order["id"]: order for order in data["orders"]}
    assert sorted(orders) == [f"order-{n:03d}" for n in range(1, 21)]
    assert [orders[f"order-00{n}"]["captured_cents"] for n in (1, 2, 3)] == [12000, 35000, 150000]
    assert all(5000 <= o["captured_cents"] <= 200000 for o in orders.values())
    assert all(o["refunded_cents"] == 0 and o["currency"] == "USD" for o in orders.values())
    assert orders["order-015"]["tenant"] == "acme"
    assert orders["order-016"]["tenant"] == "globex"
    assert orders["order-007"]["customer_email"] == "customer-007@example.com"

    warehouses = {w["id"]: w for w in data["warehouses"]}
    assert {w: warehouses[w]["tenant"] for w in warehouses} == {
        "wh-acme-1": "acme",
        "wh-acme-2": "acme",
        "wh-globex-1": "globex",
    }
    # PART-200 in wh-acme-1 is 49: the seeded reservation rsv_seed0001 holds one.
    assert warehouses["wh-acme-1"]["stock"] == {"PART-100": 50, "PART-200": 49, "PART-300": 1}
    assert warehouses["wh-globex-1"]["stock"]["PART-300"] == 50

    addresses = {a["id"]: a for a in data["addresses"]}
    assert sorted(a for a in addresses if addresses[a]["valid"]) == [
        f"addr-{n:03d}" for n in range(1, 11)
    ]
    assert addresses["addr-bad-001"]["valid"] is False


def test_refund_happy_path_and_lookups(sandbox: Sandbox) -> None:
    response = sandbox.post(
        "payments", "/refunds", refund(amount_cents=2500), request_id="ext-1", key="key-1"
    )
    assert response.status_code == 201
    created = response.json()
    assert created["refund_id"].startswith("re_")
    assert created["status"] == "succeeded"
    assert (created["order_id"], created["amount_cents"], created["currency"]) == (
        "order-001",
        2500,
        "USD",
    )
    assert (created["request_id"], created["idempotency_key"]) == ("ext-1", "key-1")
    assert "Idempotent-Replayed" not in response.headers

    by_request = sandbox.get("payments", "/refunds/lookup", {"request_id": "ext-1"})
    by_key = sandbox.get("payments", "/refunds/lookup", {"idempotency_key": "key-1"})
    assert by_request.status_code == by_key.status_code == 200
    assert by_request.json() == by_key.json() == created
    missing = sandbox.get("payments", "/refunds/lookup", {"request_id": "nope"})
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"

    order = sandbox.order("order-001")
    assert (order["captured_cents"], order["refunded_cents"]) == (12000, 2500)
    assert [r["refund_id"] for r in order["refunds"]] == [created["refund_id"]]

    [effect] = sandbox.ledger()
    assert effect["seq"] == 1
    assert (effect["system"], effect["operation"]) == ("payments", "refund.create")
    assert (effect["resource_id"], effect["request_id"], effect["idempotency_key"]) == (
        created["refund_id"],
        "ext-1",
        "key-1",
    )
    assert effect["payload"]["amount_cents"] == 2500


def test_write_without_request_id_is_rejected(sandbox: Sandbox) -> None:
    response = sandbox.post("payments", "/refunds", refund(), request_id=None)
    assert response.status_code == 400
    assert response.json()["error"] == "missing_request_id"
    assert sandbox.ledger() == []


def test_invalid_request_schema(sandbox: Sandbox) -> None:
    for body in (
        {"order_id": "order-001", "currency": "USD"},
        {**refund(), "amount_cents": 0},
        {**refund(), "amount_cents": "10"},
        {**refund(), "amount_cents": True},
    ):
        response = sandbox.post("payments", "/refunds", body)
        assert response.status_code == 400, body
        assert response.json()["error"] == "invalid_request"
    unknown = sandbox.post("payments", "/refunds", refund(order_id="order-999"))
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "order_not_found"


def test_idempotent_replay_returns_first_result_without_second_effect(sandbox: Sandbox) -> None:
    first = sandbox.post("payments", "/refunds", refund(), request_id="r1", key="k")
    # Same body with keys in another order: compared as canonical JSON, so it is a replay.
    reordered = {"currency": "USD", "amount_cents": 1000, "order_id": "order-001"}
    second = sandbox.post("payments", "/refunds", reordered, request_id="r2", key="k")
    assert first.status_code == second.status_code == 201
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert len(sandbox.ledger("payments")) == 1
    assert sandbox.order("order-001")["refunded_cents"] == 1000


def test_same_key_different_body_is_rejected(sandbox: Sandbox) -> None:
    assert sandbox.post("payments", "/refunds", refund(), key="k").status_code == 201
    response = sandbox.post("payments", "/refunds", refund(amount_cents=1001), key="k")
    assert response.status_code == 422
    assert response.json()["error"] == "idempotency_key_reuse"
    assert len(sandbox.ledger()) == 1


def test_idempotency_keys_are_scoped_per_system(sandbox: Sandbox) -> None:
    assert sandbox.post("payments", "/refunds", refund(), key="shared").status_code == 201
    email = {"to": "a@example.com", "subject": "Hi", "body": "Hello"}
    response = sandbox.post("mailer", "/emails", email, key="shared")
    assert response.status_code == 202
    assert "Idempotent-Replayed" not in response.headers


def test_amount_over_captured_is_rejected(sandbox: Sandbox) -> None:
    over = sandbox.post("payments", "/refunds", refund(amount_cents=12001))
    assert over.status_code == 422
    assert over.json()["error"] == "amount_exceeds_captured"
    assert sandbox.post("payments", "/refunds", refund(amount_cents=7000)).status_code == 201
    # Earlier refunds count: only 5000 of the 12000 captured are left.
    assert sandbox.post("payments", "/refunds", refund(amount_cents=5001)).status_code == 422
    assert sandbox.post("payments", "/refunds", refund(amount_cents=5000)).status_code == 201
    assert sandbox.order("order-001")["refunded_cents"] == 12000
    assert len(sandbox.ledger()) == 2


def test_auth_is_required_per_system(sandbox: Sandbox) -> None:
    no_token = sandbox.client.post(
        "/payments/refunds", json=refund(), headers={"X-Request-Id": "r"}
    )
    wrong_system = sandbox.post("payments", "/refunds", refund(), token="dev-carrier-key")
    read = sandbox.get("payments", "/orders/order-001", token="wrong")
    for response in (no_token, wrong_system, read):
        assert response.status_code == 401
        assert response.json() == {"error": "auth_failed", "message": response.json()["message"]}
    assert sandbox.ledger() == []
    assert sandbox.get("payments", "/orders/order-001").status_code == 200


def test_concurrent_requests_with_one_key_make_one_effect(sandbox: Sandbox) -> None:
    barrier = threading.Barrier(20)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        with httpx.Client(base_url=sandbox.url, timeout=10) as client:
            barrier.wait()
            response = sandbox.post(
                "payments",
                "/refunds",
                refund(amount_cents=100),
                request_id=f"r-{n}",
                key="race",
                client=client,
            )
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(responses) == 20
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["refund_id"] for r in responses}) == 1
    assert sum("Idempotent-Replayed" not in r.headers for r in responses) == 1
    assert len(sandbox.ledger()) == 1
    assert sandbox.order("order-001")["refunded_cents"] == 100
