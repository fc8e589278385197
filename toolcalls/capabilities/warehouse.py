"""The warehouse's contracts: warranty and stock reads, reserving and releasing stock."""

from __future__ import annotations

from typing import Any

from toolcalls.capabilities.base import (
    ORDER_ID,
    Capability,
    Problems,
    Request,
    TrustedData,
    confirmed,
    owned,
    problem,
    register,
    schema,
)

WAREHOUSE_ID = {"type": "string", "title": "Warehouse", "minLength": 1, "maxLength": 50}
SKU = {"type": "string", "title": "Part (SKU)", "minLength": 1, "maxLength": 50}


def _check_warranty(data: TrustedData, args: dict[str, Any]) -> Problems:
    return owned(
        data, data.get("warehouse", f"/warranty/{args['order_id']}"), "order", "args.order_id"
    )


register(
    Capability(
        id="check-warranty-v1",
        version=1,
        title="Check an order's warranty",
        system="warehouse",
        action="check-warranty",
        kind="read",
        permission="warranty.read",
        risk="low",
        reversible=True,
        input_schema=schema({"order_id": ORDER_ID}, ["order_id"], {"order_id": "order-001"}),
        object_ref=lambda a: f"order:{a['order_id']}",
        identity_fields=("order_id",),
        build_request=lambda a: Request("GET", f"/warranty/{a['order_id']}"),
        summary=lambda a: f"Check the warranty of order {a['order_id']}.",
        business_check=_check_warranty,
        external_id_field="order_id",
        lookup_path=None,
        consistency_window=0,
        verify=None,
    )
)


def _check_stock(data: TrustedData, args: dict[str, Any]) -> Problems:
    warehouse = data.get("warehouse", f"/warehouses/{args['warehouse_id']}")
    return owned(data, warehouse, "warehouse", "args.warehouse_id")


register(
    Capability(
        id="check-stock-v1",
        version=1,
        title="Check stock in a warehouse",
        system="warehouse",
        action="check-stock",
        kind="read",
        permission="stock.read",
        risk="low",
        reversible=True,
        input_schema=schema(
            {
                "warehouse_id": WAREHOUSE_ID,
                "sku": SKU,
            },
            ["warehouse_id", "sku"],
            {"warehouse_id": "wh-acme-1", "sku": "PART-100"},
        ),
        object_ref=lambda a: f"stock:{a['warehouse_id']}:{a['sku']}",
        identity_fields=("warehouse_id", "sku"),
        build_request=lambda a: Request("GET", f"/warehouses/{a['warehouse_id']}"),
        summary=lambda a: f"Check stock of {a['sku']} in {a['warehouse_id']}.",
        business_check=_check_stock,
        external_id_field="id",
        lookup_path=None,
        consistency_window=0,
        verify=None,
    )
)


# --- stock ----------------------------------------------------------------------------------


def _check_reservation(data: TrustedData, args: dict[str, Any]) -> Problems:
    warehouse = data.get("warehouse", f"/warehouses/{args['warehouse_id']}")
    problems = owned(data, warehouse, "warehouse", "args.warehouse_id")
    if problems:
        return problems
    if args["sku"] not in warehouse["stock"]:
        return problem("args.sku", f"Warehouse {args['warehouse_id']} does not stock it.")
    return owned(
        data, data.get("payments", f"/orders/{args['order_id']}"), "order", "args.order_id"
    )


def _verify_reservation(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    reservation = data.get("warehouse", f"/reservations/{external_id}")
    if reservation is None:
        return "confirmed_failure"
    return confirmed(reservation["status"] == "reserved")


def _check_release(data: TrustedData, args: dict[str, Any]) -> Problems:
    reservation = data.get("warehouse", f"/reservations/{args['reservation_id']}")
    if reservation is None:
        return problem("args.reservation_id", "No reservation has this id.")
    warehouse = data.get("warehouse", f"/warehouses/{reservation['warehouse_id']}")
    return owned(data, warehouse, "reservation", "args.reservation_id")


def _verify_release(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    reservation = data.get("warehouse", f"/reservations/{args['reservation_id']}")
    if reservation is None:
        return "confirmed_failure"
    return confirmed(reservation["status"] == "released")


register(
    Capability(
        id="reserve-stock-v1",
        version=1,
        title="Reserve stock for an order",
        system="warehouse",
        action="reserve",
        kind="write",
        permission="stock.reserve",
        risk="medium",
        reversible=True,
        input_schema=schema(
            {
                "warehouse_id": WAREHOUSE_ID,
                "sku": SKU,
                "quantity": {"type": "integer", "title": "Quantity", "minimum": 1, "maximum": 1000},
                "order_id": ORDER_ID,
            },
            ["warehouse_id", "sku", "quantity", "order_id"],
            {
                "warehouse_id": "wh-acme-1",
                "sku": "PART-100",
                "quantity": 1,
                "order_id": "order-001",
            },
        ),
        object_ref=lambda a: f"order:{a['order_id']}:reservation",
        identity_fields=("order_id",),
        build_request=lambda a: Request("POST", "/reservations", dict(a)),
        summary=lambda a: (
            f"Reserve {a['quantity']} x {a['sku']} in {a['warehouse_id']} for {a['order_id']}."
        ),
        business_check=_check_reservation,
        external_id_field="reservation_id",
        lookup_path="/reservations/lookup",
        consistency_window=2.0,
        verify=_verify_reservation,
        compensation="release-stock-v1",
        compensation_args=lambda external_id, args: {"reservation_id": external_id},
        remote_dedupe_window=24 * 3600,
    )
)

register(
    Capability(
        id="release-stock-v1",
        version=1,
        title="Release a stock reservation",
        system="warehouse",
        action="release",
        kind="write",
        permission="stock.reserve",
        risk="low",
        reversible=False,
        input_schema=schema(
            {
                "reservation_id": {
                    "type": "string",
                    "title": "Reservation",
                    "pattern": "^rsv_[A-Za-z0-9]+$",
                }
            },
            ["reservation_id"],
            {"reservation_id": "rsv_seed0001"},
        ),
        object_ref=lambda a: f"reservation:{a['reservation_id']}",
        identity_fields=("reservation_id",),
        build_request=lambda a: Request("POST", f"/reservations/{a['reservation_id']}/release"),
        summary=lambda a: f"Release reservation {a['reservation_id']}.",
        business_check=_check_release,
        external_id_field="reservation_id",
        # Releasing is idempotent at the warehouse: the reservation itself is the look-up.
        lookup_path=None,
        consistency_window=0,
        verify=_verify_release,
        remote_dedupe_window=24 * 3600,
    )
)
