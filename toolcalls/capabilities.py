"""Capability contracts, registered in code (DESIGN section 5).

A contract says what a tool call may contain (a JSON Schema, `additionalProperties: false`),
checks it against trusted data at the external system (never against what the agent claims),
and tells the dispatcher how to send it, look it up, verify it, retry it and undo it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import jsonschema

from toolcalls import connectors

Problems = list[dict[str, str]]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    base_delay: float
    max_delay: float


# Errors that prove nothing was executed; each capability may tune them.
DEFAULT_RETRY = {
    "tool.rate_limited": RetryPolicy(max_attempts=6, base_delay=0.5, max_delay=20),
    "tool.upstream_5xx": RetryPolicy(max_attempts=5, base_delay=0.5, max_delay=10),
    "tool.unreachable": RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=15),
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: dict[str, Any] | None = None


class TrustedData:
    """Reads at the external system with server-side credentials, for business checks and
    verification. A read that fails raises UpstreamUnavailable."""

    def __init__(self, tenant_slug: str, timeout: float = 5.0) -> None:
        self.tenant_slug = tenant_slug
        self.timeout = timeout

    def get(self, system: str, path: str) -> dict[str, Any] | None:
        endpoint = connectors.endpoint_for(self.tenant_slug, system)
        try:
            response = connectors.request(endpoint, "GET", path, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(f"{system} did not answer: {type(exc).__name__}") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise UpstreamUnavailable(f"{system} answered {response.status_code}")
        return response.json()


class UpstreamUnavailable(Exception):
    pass


@dataclass(frozen=True)
class Capability:
    id: str
    version: int
    title: str
    system: str
    action: str
    kind: Literal["read", "write"]
    permission: str
    risk: Literal["low", "medium", "high"]
    reversible: bool
    input_schema: dict[str, Any]
    object_ref: Callable[[dict[str, Any]], str]
    build_request: Callable[[dict[str, Any]], Request]
    summary: Callable[[dict[str, Any]], str]
    business_check: Callable[[TrustedData, dict[str, Any]], Problems]
    # The field of the response that names the operation at the external system.
    external_id_field: str
    # GET path (query `request_id=`) that finds the operation by our external request id.
    lookup_path: str | None
    # How long a look-up may miss an operation that did happen ("not found" is no proof).
    consistency_window: float
    # (trusted data, the call's external id, its args) -> confirmed_success /
    # confirmed_failure / inconclusive
    verify: Callable[[TrustedData, str, dict[str, Any]], str] | None
    compensation: str | None = None
    compensation_args: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    # The remote keeps idempotency keys this long (seconds); None: it does not deduplicate.
    remote_dedupe_window: float | None = None
    timeout: float = 5.0
    retry: dict[str, RetryPolicy] = field(default_factory=lambda: dict(DEFAULT_RETRY))
    # Look-ups before an unknown outcome goes to a person.
    max_lookups: int = 6
    # A response status meaning the operation already finished (not just accepted).
    completes_on_response: bool = True

    @property
    def irreversible(self) -> bool:
        return self.kind == "write" and not self.reversible and self.compensation is None

    def validate(self, args: Any) -> Problems:
        validator = jsonschema.Draft202012Validator(self.input_schema)
        problems = []
        for error in sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in error.absolute_path)
            if error.validator == "additionalProperties":
                path = "args"
            problems.append(
                {
                    "field": f"args.{path}" if path and path != "args" else "args",
                    "problem": error.message,
                }
            )
        return problems

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "title": self.title,
            "system": self.system,
            "kind": self.kind,
            "permission": self.permission,
            "risk": self.risk,
            "reversible": self.reversible,
            "compensation": self.compensation,
            "irreversible": self.irreversible,
            "lookup": bool(self.lookup_path),
            "consistency_window_seconds": self.consistency_window,
            "remote_dedupe_window_seconds": self.remote_dedupe_window,
            "timeout_seconds": self.timeout,
            "retry": {
                name: {
                    "max_attempts": p.max_attempts,
                    "base_delay": p.base_delay,
                    "max_delay": p.max_delay,
                }
                for name, p in self.retry.items()
            },
            "input_schema": self.input_schema,
        }


REGISTRY: dict[str, Capability] = {}


def register(capability: Capability) -> Capability:
    jsonschema.Draft202012Validator.check_schema(capability.input_schema)
    REGISTRY[capability.id] = capability
    return capability


def get(capability_id: str) -> Capability | None:
    return REGISTRY.get(capability_id)


# --- shared pieces --------------------------------------------------------------------------


def schema(properties: dict[str, Any], required: list[str], example: dict[str, Any]) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": required,
        "properties": properties,
        "examples": [example],
    }


ORDER_ID = {"type": "string", "pattern": "^order-[0-9]{3}$"}


def problem(field_name: str, text: str) -> Problems:
    return [{"field": field_name, "problem": text}]


def owned(data: TrustedData, record: dict[str, Any] | None, what: str, field_name: str) -> Problems:
    # Another tenant's object is reported exactly like a missing one.
    if record is None or record.get("tenant") != data.tenant_slug:
        return problem(field_name, f"No {what} of this tenant has this id.")
    return []


def confirmed(ok: bool) -> str:
    return "confirmed_success" if ok else "confirmed_failure"


# --- reads ----------------------------------------------------------------------------------


def _check_order(data: TrustedData, args: dict[str, Any]) -> Problems:
    return owned(
        data, data.get("payments", f"/orders/{args['order_id']}"), "order", "args.order_id"
    )


def _check_warranty(data: TrustedData, args: dict[str, Any]) -> Problems:
    return owned(
        data, data.get("warehouse", f"/warranty/{args['order_id']}"), "order", "args.order_id"
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
        build_request=lambda a: Request("GET", f"/orders/{a['order_id']}"),
        summary=lambda a: f"Read order {a['order_id']}.",
        business_check=_check_order,
        external_id_field="id",
        lookup_path=None,
        consistency_window=0,
        verify=None,
    )
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
                "warehouse_id": {"type": "string", "minLength": 1, "maxLength": 50},
                "sku": {"type": "string", "minLength": 1, "maxLength": 50},
            },
            ["warehouse_id", "sku"],
            {"warehouse_id": "wh-acme-1", "sku": "PART-100"},
        ),
        object_ref=lambda a: f"stock:{a['warehouse_id']}:{a['sku']}",
        build_request=lambda a: Request("GET", f"/warehouses/{a['warehouse_id']}"),
        summary=lambda a: f"Check stock of {a['sku']} in {a['warehouse_id']}.",
        business_check=_check_stock,
        external_id_field="id",
        lookup_path=None,
        consistency_window=0,
        verify=None,
    )
)


# --- refunds --------------------------------------------------------------------------------


def _check_refund(data: TrustedData, args: dict[str, Any]) -> Problems:
    order = data.get("payments", f"/orders/{args['order_id']}")
    problems = owned(data, order, "order", "args.order_id")
    if problems:
        return problems
    if args["currency"].upper() != order["currency"].upper():
        return problem("args.currency", f"The order was paid in {order['currency']}.")
    if args["amount_cents"] > order["refundable_cents"]:
        return problem(
            "args.amount_cents",
            f"At most {order['refundable_cents']} cents of this order can still be refunded "
            f"(captured {order['captured_cents']}, refunded {order['refunded_cents']}).",
        )
    return []


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
        id="refund-order-v2",
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
                "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
                "currency": {"type": "string", "pattern": "^[A-Za-z]{3}$"},
                "reason": {"type": "string", "maxLength": 500},
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
        build_request=lambda a: Request("POST", "/refunds", dict(a)),
        summary=lambda a: (
            f"Refund {a['amount_cents'] / 100:.2f} {a['currency'].upper()} on order "
            f"{a['order_id']}" + (f" ({a['reason']})" if a.get("reason") else "") + "."
        ),
        business_check=_check_refund,
        external_id_field="refund_id",
        lookup_path="/refunds/lookup",
        consistency_window=2.0,
        verify=_verify_refund,
        remote_dedupe_window=24 * 3600,
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
                "warehouse_id": {"type": "string", "minLength": 1, "maxLength": 50},
                "sku": {"type": "string", "minLength": 1, "maxLength": 50},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
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
            {"reservation_id": {"type": "string", "pattern": "^rsv_[A-Za-z0-9]+$"}},
            ["reservation_id"],
            {"reservation_id": "rsv_seed0001"},
        ),
        object_ref=lambda a: f"reservation:{a['reservation_id']}",
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
                "address_id": {"type": "string", "minLength": 1, "maxLength": 50},
                "reservation_id": {"type": "string", "maxLength": 50},
            },
            ["order_id", "address_id"],
            {"order_id": "order-001", "address_id": "addr-001"},
        ),
        object_ref=lambda a: f"order:{a['order_id']}:shipment",
        build_request=lambda a: Request("POST", "/waybills", dict(a)),
        summary=lambda a: f"Create a waybill for {a['order_id']} to address {a['address_id']}.",
        business_check=_check_waybill,
        external_id_field="waybill_id",
        lookup_path="/waybills/lookup",
        # The carrier's look-up lags: a new waybill may be "not found" for a while.
        consistency_window=5.0,
        verify=_verify_waybill,
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
            {"waybill_id": {"type": "string", "pattern": "^wb_[A-Za-z0-9]+$"}},
            ["waybill_id"],
            {"waybill_id": "wb_seed0001"},
        ),
        object_ref=lambda a: f"waybill:{a['waybill_id']}",
        build_request=lambda a: Request("POST", f"/waybills/{a['waybill_id']}/cancel"),
        summary=lambda a: f"Cancel waybill {a['waybill_id']}.",
        business_check=_check_cancel_waybill,
        external_id_field="waybill_id",
        lookup_path=None,
        consistency_window=0,
        verify=_verify_cancel_waybill,
    )
)


# --- email ----------------------------------------------------------------------------------


def _check_email(data: TrustedData, args: dict[str, Any]) -> Problems:
    order = data.get("payments", f"/orders/{args['order_id']}")
    problems = owned(data, order, "order", "args.order_id")
    if problems:
        return problems
    # Agents may write only to the order's own customer, whatever a page or a prompt says.
    if args["to"].lower() != order["customer_email"].lower():
        return problem("args.to", "Emails go only to the order's customer address.")
    return []


def _verify_email(data: TrustedData, external_id: str, args: dict[str, Any]) -> str:
    email = data.get("mailer", f"/emails/{external_id}")
    if email is None:
        return "inconclusive"
    return confirmed(email["status"] == "sent")


register(
    Capability(
        id="send-email-v1",
        version=1,
        title="Email a customer",
        system="mailer",
        action="email",
        kind="write",
        permission="customers.email",
        risk="medium",
        reversible=False,
        input_schema=schema(
            {
                "order_id": ORDER_ID,
                "to": {"type": "string", "format": "email", "maxLength": 200},
                "subject": {"type": "string", "minLength": 1, "maxLength": 200},
                "body": {"type": "string", "minLength": 1, "maxLength": 10_000},
            },
            ["order_id", "to", "subject", "body"],
            {
                "order_id": "order-001",
                "to": "customer-001@example.com",
                "subject": "Your refund",
                "body": "We refunded your order.",
            },
        ),
        object_ref=lambda a: f"order:{a['order_id']}:customer-email",
        build_request=lambda a: Request(
            "POST", "/emails", {"to": a["to"], "subject": a["subject"], "body": a["body"]}
        ),
        summary=lambda a: f"Email {a['to']}: “{a['subject']}”.",
        business_check=_check_email,
        external_id_field="message_id",
        lookup_path="/emails/lookup",
        consistency_window=2.0,
        verify=_verify_email,
        remote_dedupe_window=24 * 3600,
    )
)
