"""The carrier's contracts: create and cancel a waybill."""

from __future__ import annotations

from typing import Any

from toolcalls.capabilities.base import (
    ORDER_ID,
    Capability,
    Fact,
    Problems,
    Request,
    TrustedData,
    confirmed,
    owned,
    problem,
    register,
    schema,
)

# --- waybills -------------------------------------------------------------------------------


def _check_waybill(data: TrustedData, args: dict[str, Any]) -> Problems:
    problems = owned(
        data, data.get("payments", f"/orders/{args['order_id']}"), "order", "args.order_id"
    )
    # Address validity is the carrier's business: it may still refuse the address.
    return problems or owned(
        data,
        data.get("carrier", f"/addresses/{args['address_id']}"),
        "address",
        "args.address_id",
    )


def _waybill_context(data: TrustedData, args: dict[str, Any]) -> list[Fact]:
    """Where the parcel goes and what it carries: the address as the carrier has it, and the
    reservation as the warehouse has it."""
    address = data.get("carrier", f"/addresses/{args['address_id']}")
    if address is None or address.get("tenant") != data.tenant_slug:
        facts = [
            Fact("Address", f"{args['address_id']} is not an address of this tenant", warn=True)
        ]
    else:
        where = ", ".join(
            str(address[part])
            for part in ("name", "street", "postal_code", "city", "country")
            if address.get(part)
        )
        facts = [Fact("Address", where)]
        if address.get("valid") is False:
            facts.append(Fact("Carrier's check", "the carrier refuses this address", warn=True))
    if not args.get("reservation_id"):
        return [*facts, Fact("Reservation", "none named: the waybill is not tied to stock")]
    reservation = data.get("warehouse", f"/reservations/{args['reservation_id']}")
    if reservation is None:
        return [*facts, Fact("Reservation", f"{args['reservation_id']} not found", warn=True)]
    return [
        *facts,
        Fact(
            "Reservation",
            f"{reservation['quantity']} x {reservation['sku']} in {reservation['warehouse_id']}"
            f" for {reservation['order_id']}, {reservation['status']}",
            warn=reservation["status"] != "reserved" or reservation["order_id"] != args["order_id"],
        ),
    ]


def _verify_waybill(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    waybill = data.get("carrier", f"/waybills/{external_id}")
    if waybill is None:
        return "inconclusive"
    if waybill["address_id"] != args["address_id"]:
        return "confirmed_failure"
    return confirmed(waybill["status"] == "created")


def _check_cancel_waybill(data: TrustedData, args: dict[str, Any]) -> Problems:
    waybill = data.get("carrier", f"/waybills/{args['waybill_id']}")
    if waybill is None:
        return problem("args.waybill_id", "No waybill has this id.")
    return owned(
        data, data.get("payments", f"/orders/{waybill['order_id']}"), "waybill", "args.waybill_id"
    )


def _verify_cancel_waybill(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    waybill = data.get("carrier", f"/waybills/{args['waybill_id']}")
    if waybill is None:
        return "confirmed_failure"
    return confirmed(waybill["status"] == "cancelled")


register(
    Capability(
        id="create-waybill-v1",
        version=1,
        title="Create a waybill",
        system="carrier",
        action="ship",
        kind="write",
        permission="shipping.create",
        risk="medium",
        reversible=True,
        input_schema=schema(
            {
                "order_id": ORDER_ID,
                "address_id": {
                    "type": "string",
                    "title": "Address",
                    "minLength": 1,
                    "maxLength": 50,
                },
                "reservation_id": {"type": "string", "title": "Reservation", "maxLength": 50},
            },
            ["order_id", "address_id"],
            {"order_id": "order-001", "address_id": "addr-001"},
        ),
        object_ref=lambda a: f"order:{a['order_id']}:shipment",
        identity_fields=("order_id",),
        build_request=lambda a: Request("POST", "/waybills", dict(a)),
        summary=lambda a: f"Create a waybill for {a['order_id']} to address {a['address_id']}.",
        business_check=_check_waybill,
        external_id_field="waybill_id",
        lookup_path="/waybills/lookup",
        # The carrier's look-up lags: a new waybill may be "not found" for a while.
        consistency_window=5.0,
        verify=_verify_waybill,
        context=_waybill_context,
        compensation="cancel-waybill-v1",
        compensation_args=lambda external_id, args: {"waybill_id": external_id},
        # The carrier ignores idempotency keys: only our look-up-before-retry prevents twins.
        remote_dedupe_window=None,
    )
)

register(
    Capability(
        id="cancel-waybill-v1",
        version=1,
        title="Cancel a waybill",
        system="carrier",
        action="cancel-shipment",
        kind="write",
        permission="shipping.create",
        risk="low",
        reversible=False,
        input_schema=schema(
            {"waybill_id": {"type": "string", "title": "Waybill", "pattern": "^wb_[A-Za-z0-9]+$"}},
            ["waybill_id"],
            {"waybill_id": "wb_seed0001"},
        ),
        object_ref=lambda a: f"waybill:{a['waybill_id']}",
        identity_fields=("waybill_id",),
        build_request=lambda a: Request("POST", f"/waybills/{a['waybill_id']}/cancel"),
        summary=lambda a: f"Cancel waybill {a['waybill_id']}.",
        business_check=_check_cancel_waybill,
        external_id_field="waybill_id",
        lookup_path=None,
        consistency_window=0,
        verify=_verify_cancel_waybill,
    )
)
