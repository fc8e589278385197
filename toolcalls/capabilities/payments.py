"""The payment system's contracts: read an order, refund it."""

from __future__ import annotations

from typing import Any

from runs.money import amount_written
from toolcalls.capabilities.base import (
    ORDER_ID,
    Capability,
    Fact,
    OpenCall,
    Problems,
    Request,
    TrustedData,
    owned,
    problem,
    register,
    schema,
)

# --- reads ----------------------------------------------------------------------------------


def _check_order(data: TrustedData, args: dict[str, Any]) -> Problems:
    return owned(
        data, data.get("payments", f"/orders/{args['order_id']}"), "order", "args.order_id"
    )


register(
    Capability(
        id="get-order-v1",
        version=1,
        title="Read an order",
        system="payments",
        action="read-order",
        kind="read",
        permission="orders.read",
        risk="low",
        reversible=True,
        input_schema=schema({"order_id": ORDER_ID}, ["order_id"], {"order_id": "order-001"}),
        object_ref=lambda a: f"order:{a['order_id']}",
        identity_fields=("order_id",),
        build_request=lambda a: Request("GET", f"/orders/{a['order_id']}"),
        summary=lambda a: f"Read order {a['order_id']}.",
        business_check=_check_order,
        external_id_field="id",
        lookup_path=None,
        consistency_window=0,
        verify=None,
    )
)

# --- refunds --------------------------------------------------------------------------------


REFUND = "refund-order-v2"


def _refunds_not_yet_booked(
    data: TrustedData, order_id: str, order: dict[str, Any]
) -> list[OpenCall]:
    """Our other refunds of this order that may still take money from it and that the payment
    system does not show yet (a refund it shows is in `refunded_cents` already)."""
    booked = {
        known
        for refund in order.get("refunds", [])
        for known in (refund.get("refund_id"), refund.get("request_id"))
        if known
    }
    return [
        call
        for call in data.open_calls(REFUND, f"order:{order_id}")
        if call.external_request_id not in booked and call.external_id not in booked
    ]


def _check_refund(data: TrustedData, args: dict[str, Any]) -> Problems:
    order = data.get("payments", f"/orders/{args['order_id']}")
    problems = owned(data, order, "order", "args.order_id")
    if problems:
        return problems
    if args["currency"].upper() != order["currency"].upper():
        return problem("args.currency", f"The order was paid in {order['currency']}.")
    others = _refunds_not_yet_booked(data, args["order_id"], order)
    pending = sum(call.args.get("amount_cents", 0) for call in others)
    refundable = order["refundable_cents"] - pending
    if args["amount_cents"] <= refundable:
        return []
    text = (
        f"At most {max(refundable, 0)} cents of this order can still be refunded (captured "
        f"{order['captured_cents']}, refunded {order['refunded_cents']}"
    )
    if others:
        named = ", ".join(
            f"{call.id} ({call.args.get('amount_cents')} cents, {call.execution_status})"
            for call in others[:10]
        )
        more = f" and {len(others) - 10} more" if len(others) > 10 else ""
        text += f", and {pending} in other refunds of this order not yet final: {named}{more}"
    return problem("args.amount_cents", text + ").")


def _refund_context(data: TrustedData, args: dict[str, Any]) -> list[Fact]:
    """What an approver weighs a refund against: the order as the payment system has it, and
    our other refunds of it that it does not show yet (the same arithmetic as the check)."""
    order = data.get("payments", f"/orders/{args['order_id']}")
    if order is None or order.get("tenant") != data.tenant_slug:
        return [Fact("Order", f"{args['order_id']} is not an order of this tenant", warn=True)]
    currency = order["currency"]
    others = _refunds_not_yet_booked(data, args["order_id"], order)
    pending = sum(call.args.get("amount_cents", 0) for call in others)
    refundable = order["refundable_cents"] - pending
    return [
        Fact("Customer", order.get("customer_email", "")),
        Fact("Captured", order["captured_cents"], cents_of=currency),
        Fact("Refunded so far", order["refunded_cents"], cents_of=currency),
        Fact(
            f"Pending or in flight here ({len(others)} refund{'s' if len(others) != 1 else ''})",
            pending,
            cents_of=currency,
            warn=bool(others),
        ),
        Fact(
            "Refundable now",
            max(refundable, 0),
            cents_of=currency,
            warn=args.get("amount_cents", 0) > refundable,
        ),
    ]


def _verify_refund(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    order = data.get("payments", f"/orders/{args['order_id']}")
    if order is None:
        return "confirmed_failure"
    refunds = {r["refund_id"]: r for r in order.get("refunds", [])}
    refund = refunds.get(external_id)
    if refund is None:
        return "inconclusive"
    if refund["amount_cents"] != args["amount_cents"]:
        return "confirmed_failure"
    return "confirmed_success" if refund["status"] == "succeeded" else "inconclusive"


register(
    Capability(
        id=REFUND,
        version=2,
        title="Refund an order",
        system="payments",
        action="refund",
        kind="write",
        permission="payments.refund",
        risk="high",
        reversible=False,
        input_schema=schema(
            {
                "order_id": ORDER_ID,
                "amount_cents": {
                    "type": "integer",
                    "title": "Amount",
                    "description": "In cents of the currency.",
                    "minimum": 1,
                    "maximum": 10_000_000,
                },
                "currency": {"type": "string", "title": "Currency", "pattern": "^[A-Za-z]{3}$"},
                "reason": {"type": "string", "title": "Reason", "maxLength": 500},
            },
            ["order_id", "amount_cents", "currency"],
            {
                "order_id": "order-001",
                "amount_cents": 1500,
                "currency": "USD",
                "reason": "item arrived damaged",
            },
        ),
        object_ref=lambda a: f"order:{a['order_id']}",
        identity_fields=("order_id",),
        build_request=lambda a: Request("POST", "/refunds", dict(a)),
        summary=lambda a: (
            f"Refund {amount_written(a['amount_cents'], a['currency'])} on order "
            f"{a['order_id']}" + (f" ({a['reason']})" if a.get("reason") else "") + "."
        ),
        business_check=_check_refund,
        external_id_field="refund_id",
        lookup_path="/refunds/lookup",
        consistency_window=2.0,
        verify=_verify_refund,
        remote_dedupe_window=24 * 3600,
        context=_refund_context,
    )
)
