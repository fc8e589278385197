"""`POST /orders`: fresh orders for a benchmark, whose answers never grow with other calls."""

from __future__ import annotations

from tests.sandbox_process import Sandbox


def test_it_adds_fresh_orders_for_a_tenant(sandbox: Sandbox) -> None:
    response = sandbox.client.post(
        "/orders", json={"tenant": "acme", "first": 100000, "count": 3, "captured_cents": 100}
    )
    assert response.status_code == 201
    assert response.json() == {"first": "order-100000", "count": 3}

    order = sandbox.get("payments", "/orders/order-100002").json()
    assert (order["tenant"], order["captured_cents"], order["refunds"]) == ("acme", 100, [])
    assert sandbox.client.get("/ledger").json()["effects"] == []


def test_a_refund_of_one_order_does_not_show_on_another(sandbox: Sandbox) -> None:
    sandbox.client.post("/orders", json={"tenant": "acme", "first": 200000, "count": 2})
    body = {"order_id": "order-200000", "amount_cents": 1, "currency": "USD"}
    assert sandbox.post("payments", "/refunds", body, request_id="r-1").status_code == 201

    assert sandbox.get("payments", "/orders/order-200001").json()["refunds"] == []
    assert len(sandbox.get("payments", "/orders/order-200000").json()["refunds"]) == 1


def test_it_refuses_numbers_that_exist_or_bad_counts(sandbox: Sandbox) -> None:
    taken = sandbox.client.post("/orders", json={"tenant": "acme", "first": 1, "count": 1})
    assert (taken.status_code, taken.json()["error"]) == (400, "invalid_request")
    for body in ({"tenant": "acme", "first": 5, "count": 0}, {"first": 300000, "count": 1}):
        assert sandbox.client.post("/orders", json=body).status_code == 400


def test_a_reset_removes_them(sandbox: Sandbox) -> None:
    sandbox.client.post("/orders", json={"tenant": "acme", "first": 400000, "count": 1})
    sandbox.client.post("/reset")

    assert sandbox.get("payments", "/orders/order-400000").status_code == 404
