"""Warehouse, carrier and mailer behaviour, admin endpoints, persistence across restarts."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime
from typing import Any

from tests.sandbox_process import Sandbox


def stock(sandbox: Sandbox, warehouse_id: str) -> dict[str, int]:
    response = sandbox.get("warehouse", f"/warehouses/{warehouse_id}")
    assert response.status_code == 200
    assert response.json()["id"] == warehouse_id
    result: dict[str, int] = response.json()["stock"]
    return result


def test_reservation_release_is_idempotent_and_restores_stock(sandbox: Sandbox) -> None:
    body = {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 5, "order_id": "order-001"}
    created = sandbox.post("warehouse", "/reservations", body, request_id="res-1")
    assert created.status_code == 201
    reservation_id = created.json()["reservation_id"]
    assert reservation_id.startswith("rsv_")
    assert created.json()["status"] == "reserved"
    assert stock(sandbox, "wh-acme-1")["PART-100"] == 45

    first = sandbox.post("warehouse", f"/reservations/{reservation_id}/release", request_id="rel-1")
    second = sandbox.post(
        "warehouse", f"/reservations/{reservation_id}/release", request_id="rel-2"
    )
    assert first.status_code == second.status_code == 200
    assert first.json()["status"] == second.json()["status"] == "released"
    assert first.json() == second.json()
    assert stock(sandbox, "wh-acme-1")["PART-100"] == 50
    operations = [effect["operation"] for effect in sandbox.ledger("warehouse")]
    assert operations == ["reservation.create", "reservation.release"]

    fetched = sandbox.get("warehouse", f"/reservations/{reservation_id}")
    assert fetched.json()["status"] == "released"
    looked_up = sandbox.get("warehouse", "/reservations/lookup", {"request_id": "res-1"})
    assert looked_up.json()["reservation_id"] == reservation_id


SEED_RESERVATION = {
    "reservation_id": "rsv_seed0001",
    "warehouse_id": "wh-acme-1",
    "sku": "PART-200",
    "quantity": 1,
    "order_id": "order-010",
    "status": "reserved",
    "request_id": "req_seed0001",
    "idempotency_key": None,
    "released_at": None,
}
SEED_WAYBILL = {
    "waybill_id": "wb_seed0001",
    "order_id": "order-010",
    "address_id": "addr-001",
    "reservation_id": "rsv_seed0001",
    "status": "created",
    "request_id": "req_seed0002",
    "cancelled_at": None,
}


def without_created_at(resource: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(resource["created_at"], str)
    return {k: v for k, v in resource.items() if k != "created_at"}


def test_seeded_reservation_and_waybill_are_readable(sandbox: Sandbox) -> None:
    by_id = sandbox.get("warehouse", "/reservations/rsv_seed0001")
    by_lookup = sandbox.get("warehouse", "/reservations/lookup", {"request_id": "req_seed0001"})
    assert by_id.status_code == by_lookup.status_code == 200
    assert by_id.json() == by_lookup.json()
    assert without_created_at(by_id.json()) == SEED_RESERVATION

    waybill = sandbox.get("carrier", "/waybills/wb_seed0001")
    waybill_lookup = sandbox.get("carrier", "/waybills/lookup", {"request_id": "req_seed0002"})
    assert waybill.status_code == waybill_lookup.status_code == 200
    assert waybill.json() == waybill_lookup.json()
    assert without_created_at(waybill.json()) == SEED_WAYBILL

    data = sandbox.client.get("/data").json()
    assert data["reservations"] == [by_id.json()]
    assert data["waybills"] == [waybill.json()]
    assert stock(sandbox, "wh-acme-1")["PART-200"] == 49
    # Seed state, not effects.
    assert sandbox.ledger() == []


def test_release_seeded_reservation_restores_stock(sandbox: Sandbox) -> None:
    released = sandbox.post("warehouse", "/reservations/rsv_seed0001/release", request_id="rel-s")
    assert released.status_code == 200
    assert released.json()["status"] == "released"
    assert released.json()["released_at"] is not None
    assert stock(sandbox, "wh-acme-1")["PART-200"] == 50
    [effect] = sandbox.ledger()
    assert (effect["operation"], effect["resource_id"], effect["request_id"]) == (
        "reservation.release",
        "rsv_seed0001",
        "rel-s",
    )
    assert effect["payload"] == released.json()
    # /data shows the seeded reservation's current state.
    assert sandbox.client.get("/data").json()["reservations"] == [released.json()]


def test_cancel_seeded_waybill(sandbox: Sandbox) -> None:
    cancelled = sandbox.post("carrier", "/waybills/wb_seed0001/cancel", request_id="can-s")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert [(e["operation"], e["resource_id"]) for e in sandbox.ledger()] == [
        ("waybill.cancel", "wb_seed0001")
    ]


def test_reset_restores_seeded_objects_with_empty_ledger(sandbox: Sandbox) -> None:
    sandbox.post("warehouse", "/reservations/rsv_seed0001/release", request_id="rel-s")
    sandbox.post("carrier", "/waybills/wb_seed0001/cancel", request_id="can-s")
    assert len(sandbox.ledger()) == 2
    assert sandbox.client.post("/reset").json() == {"ok": True}
    assert sandbox.ledger() == []
    reservation = sandbox.get("warehouse", "/reservations/rsv_seed0001").json()
    waybill = sandbox.get("carrier", "/waybills/wb_seed0001").json()
    assert without_created_at(reservation) == SEED_RESERVATION
    assert without_created_at(waybill) == SEED_WAYBILL
    assert stock(sandbox, "wh-acme-1")["PART-200"] == 49


def test_reservation_errors(sandbox: Sandbox) -> None:
    base = {"warehouse_id": "wh-acme-1", "sku": "PART-300", "quantity": 2, "order_id": "order-001"}
    out_of_stock = sandbox.post("warehouse", "/reservations", base)
    assert out_of_stock.status_code == 409
    assert out_of_stock.json()["error"] == "out_of_stock"
    unknown_warehouse = sandbox.post("warehouse", "/reservations", {**base, "warehouse_id": "x"})
    unknown_sku = sandbox.post("warehouse", "/reservations", {**base, "sku": "PART-999"})
    assert (unknown_warehouse.status_code, unknown_sku.status_code) == (404, 404)
    assert sandbox.post("warehouse", "/reservations", {**base, "quantity": 1}).status_code == 201
    assert stock(sandbox, "wh-acme-1")["PART-300"] == 0
    assert len(sandbox.ledger()) == 1


def still_valid_on(expires_on: str) -> bool:
    # The seed's dates are fixed; in_warranty is judged against today's UTC date.
    return datetime.now(UTC).date() <= date.fromisoformat(expires_on)


def test_warranty_valid(sandbox: Sandbox) -> None:
    response = sandbox.get("warehouse", "/warranty/order-002")
    assert response.status_code == 200
    assert response.json() == {
        "order_id": "order-002",
        "tenant": "acme",
        "sku": "PART-200",
        "warranty_expires_on": "2036-06-30",
        "in_warranty": still_valid_on("2036-06-30"),
    }
    globex = sandbox.get("warehouse", "/warranty/order-016").json()
    assert (globex["tenant"], globex["sku"]) == ("globex", "PART-100")


def test_warranty_expired(sandbox: Sandbox) -> None:
    response = sandbox.get("warehouse", "/warranty/order-007")
    assert response.status_code == 200
    warranty = response.json()
    assert warranty["order_id"] == "order-007"
    assert warranty["sku"] == "PART-100"
    assert warranty["warranty_expires_on"].startswith("2024-")
    assert warranty["in_warranty"] is False


def test_warranty_unknown_order(sandbox: Sandbox) -> None:
    response = sandbox.get("warehouse", "/warranty/order-999")
    assert response.status_code == 404
    assert response.json()["error"] == "order_not_found"


def test_warranty_requires_warehouse_token(sandbox: Sandbox) -> None:
    missing = sandbox.client.get("/warehouse/warranty/order-001")
    wrong = sandbox.get("warehouse", "/warranty/order-001", token="dev-payments-key")
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"] == wrong.json()["error"] == "auth_failed"


def test_warranties_in_seed_data(sandbox: Sandbox) -> None:
    warranties = {w["order_id"]: w for w in sandbox.client.get("/data").json()["warranties"]}
    assert sorted(warranties) == [f"order-{n:03d}" for n in range(1, 21)]
    skus = ("PART-100", "PART-200", "PART-300")
    assert all(warranties[f"order-{n:03d}"]["sku"] == skus[(n - 1) % 3] for n in range(1, 21))
    expired = sorted(o for o, w in warranties.items() if w["warranty_expires_on"] < "2025")
    assert expired == ["order-007", "order-013"]
    assert not any(warranties[o]["in_warranty"] for o in expired)
    assert all(
        w["in_warranty"] == still_valid_on(w["warranty_expires_on"]) for w in warranties.values()
    )
    assert warranties["order-020"]["tenant"] == "globex"
    # Same view as the warehouse endpoint.
    assert warranties["order-013"] == sandbox.get("warehouse", "/warranty/order-013").json()


def test_carrier_ignores_idempotency_key(sandbox: Sandbox) -> None:
    body = {"order_id": "order-001", "address_id": "addr-001"}
    first = sandbox.post("carrier", "/waybills", body, request_id="wb-req", key="same-key")
    second = sandbox.post("carrier", "/waybills", body, request_id="wb-req", key="same-key")
    assert first.status_code == second.status_code == 201
    assert "Idempotent-Replayed" not in second.headers
    assert first.json()["waybill_id"] != second.json()["waybill_id"]
    assert first.json()["waybill_id"].startswith("wb_")
    assert [e["operation"] for e in sandbox.ledger("carrier")] == ["waybill.create"] * 2
    # With duplicates, the look-up answers the earliest one.
    looked_up = sandbox.get("carrier", "/waybills/lookup", {"request_id": "wb-req"})
    assert looked_up.json()["waybill_id"] == first.json()["waybill_id"]


def test_carrier_address_validation_and_cancel(sandbox: Sandbox) -> None:
    bad = sandbox.post(
        "carrier", "/waybills", {"order_id": "order-001", "address_id": "addr-bad-001"}
    )
    assert bad.status_code == 422
    assert bad.json()["error"] == "address_invalid"
    unknown = sandbox.post(
        "carrier", "/waybills", {"order_id": "order-001", "address_id": "addr-x"}
    )
    assert unknown.status_code == 404
    created = sandbox.post(
        "carrier", "/waybills", {"order_id": "order-001", "address_id": "addr-002"}
    )
    waybill_id = created.json()["waybill_id"]
    for request_id in ("c1", "c2"):
        cancelled = sandbox.post("carrier", f"/waybills/{waybill_id}/cancel", request_id=request_id)
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
    operations = [e["operation"] for e in sandbox.ledger("carrier")]
    assert operations == ["waybill.create", "waybill.cancel"]


def test_lookup_lag(sandbox: Sandbox) -> None:
    sandbox.faults(system="carrier", lookup_lag_seconds=1)
    created = sandbox.post(
        "carrier",
        "/waybills",
        {"order_id": "order-001", "address_id": "addr-001"},
        request_id="lag-1",
    )
    created_at = time.monotonic()  # the sandbox created it before it answered
    assert created.status_code == 201
    early = sandbox.get("carrier", "/waybills/lookup", {"request_id": "lag-1"})
    assert early.status_code == 404
    assert early.json()["error"] == "not_found"
    # Fetching by id is not subject to the lag; only look-ups are eventually consistent.
    assert sandbox.get("carrier", f"/waybills/{created.json()['waybill_id']}").status_code == 200
    # Once older than the lag it is found: a lag shorter than its age stands for time passing.
    sandbox.faults(system="carrier", lookup_lag_seconds=(time.monotonic() - created_at) / 2)
    late = sandbox.get("carrier", "/waybills/lookup", {"request_id": "lag-1"})
    assert late.status_code == 200
    assert late.json() == created.json()


def test_mailer_send_replay_and_lookup(sandbox: Sandbox) -> None:
    email = {"to": "customer-001@example.com", "subject": "Refund", "body": "Done."}
    first = sandbox.post("mailer", "/emails", email, request_id="m1", key="mk")
    replay = sandbox.post("mailer", "/emails", email, request_id="m1", key="mk")
    assert first.status_code == replay.status_code == 202
    assert first.json()["message_id"].startswith("msg_")
    assert first.json()["status"] == "sent"
    assert replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"
    looked_up = sandbox.get("mailer", "/emails/lookup", {"idempotency_key": "mk"})
    assert looked_up.json()["message_id"] == first.json()["message_id"]
    assert [e["operation"] for e in sandbox.ledger()] == ["email.send"]


def test_restart_keeps_state(sandbox: Sandbox) -> None:
    body = {"order_id": "order-002", "amount_cents": 5000, "currency": "USD"}
    created = sandbox.post("payments", "/refunds", body, request_id="persist", key="pk")
    assert created.status_code == 201
    sandbox.faults(system="payments", http_5xx=1.0)

    assert sandbox.stop() == 0
    sandbox.start()

    assert [e["resource_id"] for e in sandbox.ledger()] == [created.json()["refund_id"]]
    assert sandbox.order("order-002")["refunded_cents"] == 5000
    # Faults live in memory only, and the idempotency record survived the restart.
    replay = sandbox.post("payments", "/refunds", body, request_id="persist", key="pk")
    assert replay.status_code == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == created.json()


def test_reset_reseeds_and_clears(sandbox: Sandbox) -> None:
    body = {"order_id": "order-003", "amount_cents": 100, "currency": "USD"}
    assert sandbox.post("payments", "/refunds", body, key="rk").status_code == 201
    sandbox.faults(system="*", http_5xx=0.5)
    assert sandbox.client.post("/reset").json() == {"ok": True}
    assert sandbox.ledger() == []
    assert sandbox.order("order-003")["refunded_cents"] == 0
    faults = sandbox.client.get("/faults").json()
    assert all(state["faults"] == {} for state in faults.values())
    again = sandbox.post("payments", "/refunds", body, key="rk")
    assert "Idempotent-Replayed" not in again.headers
    assert sandbox.ledger()[0]["seq"] == 1
