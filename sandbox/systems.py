"""The four simulated external systems: their routes, tokens and domain rules.

Handlers receive the shared SQLite connection (inside a write transaction for POSTs) and a parsed
``Call``; they return a ``Reply`` or raise ``ApiError``. Every committed effect appends exactly one
ledger row in the same transaction, so the ledger can never disagree with the resources.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .protocol import (
    ApiError,
    Call,
    Reply,
    invalid,
    optional_str,
    require_positive_int,
    require_str,
)
from .store import (
    WARRANTY_SELECT,
    Store,
    address_view,
    new_id,
    reservation_view,
    utc_now,
    warranty_view,
    waybill_view,
)

# Development bearer tokens, one per system; a token of one system is rejected by the others.
TOKENS = {
    "payments": "dev-payments-key",
    "warehouse": "dev-warehouse-key",
    "carrier": "dev-carrier-key",
    "mailer": "dev-mailer-key",
}

# Systems that honour Idempotency-Key. The carrier deliberately does not: only the caller's own
# discipline (look up before retrying) prevents duplicate waybills there.
IDEMPOTENT_SYSTEMS = frozenset({"payments", "warehouse", "mailer"})

Handler = Callable[[sqlite3.Connection, Call], Reply]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler


def _route(method: str, template: str, handler: Handler) -> Route:
    """``/refunds/{refund_id}`` -> a regex with a named group per ``{param}``."""
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    return Route(method, re.compile(f"^{regex}$"), handler)


# -- shared helpers ------------------------------------------------------------------------------


def _lookup(
    conn: sqlite3.Connection,
    call: Call,
    table: str,
    view: Callable[[sqlite3.Row], dict[str, Any]],
    *,
    by_key: bool = True,
) -> Reply:
    """Find the resource created by a request id (or idempotency key).

    If several resources carry the same id (possible at the carrier), the earliest is returned.
    Resources younger than the system's ``lookup_lag_seconds`` are not visible yet: this models
    an eventually consistent read side, which callers must tolerate during reconciliation.
    """
    request_id = call.query.get("request_id")
    key = call.query.get("idempotency_key") if by_key else None
    if not by_key and "idempotency_key" in call.query:
        raise invalid("this system ignores idempotency keys; look up by request_id")
    if (request_id is None) == (key is None):
        raise invalid(
            "give exactly one of request_id or idempotency_key"
            if by_key
            else "request_id is required"
        )
    column, value = (
        ("request_id", request_id) if request_id is not None else ("idempotency_key", key)
    )
    row = conn.execute(
        f"SELECT * FROM {table} WHERE {column} = ? ORDER BY created_ts, rowid LIMIT 1", (value,)
    ).fetchone()
    if row is None or row["created_ts"] > time.time() - call.lookup_lag_seconds:
        raise ApiError(404, "not_found", f"no resource with {column} {value!r}")
    return Reply(200, view(row))


def _get(conn: sqlite3.Connection, table: str, resource_id: str, error: str) -> sqlite3.Row:
    row = conn.execute(f"SELECT * FROM {table} WHERE id = ?", (resource_id,)).fetchone()
    if row is None:
        raise ApiError(404, error, f"{resource_id!r} does not exist")
    return row


def _record(
    conn: sqlite3.Connection,
    call: Call,
    operation: str,
    resource: dict[str, Any],
    at: str,
    resource_id: str,
) -> None:
    # The ledger records the headers as received, even where the system ignores them (carrier),
    # so a demo can show "same Idempotency-Key, two waybills".
    Store.append_effect(
        conn,
        system=call.system,
        operation=operation,
        resource_id=resource_id,
        request_id=call.request_id,
        idempotency_key=call.idempotency_key,
        payload=resource,
        at=at,
    )


# -- payments ------------------------------------------------------------------------------------


def refund_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "refund_id": row["id"],
        "order_id": row["order_id"],
        "amount_cents": row["amount_cents"],
        "currency": row["currency"],
        "reason": row["reason"],
        "status": row["status"],
        "request_id": row["request_id"],
        "idempotency_key": row["idempotency_key"],
        "created_at": row["created_at"],
    }


def create_refund(conn: sqlite3.Connection, call: Call) -> Reply:
    order_id = require_str(call.body, "order_id")
    amount = require_positive_int(call.body, "amount_cents")
    currency = require_str(call.body, "currency")
    reason = optional_str(call.body, "reason")
    order = _get(conn, "orders", order_id, "order_not_found")
    if currency.upper() != order["currency"]:
        raise ApiError(
            422, "currency_mismatch", f"order {order_id} is in {order['currency']}, not {currency}"
        )
    refundable = order["captured_cents"] - order["refunded_cents"]
    if amount > refundable:
        raise ApiError(
            422,
            "amount_exceeds_captured",
            f"amount_cents {amount} exceeds the refundable {refundable} "
            f"(captured {order['captured_cents']}, "
            f"already refunded {order['refunded_cents']})",
        )
    refund_id = new_id("re")
    at, ts = utc_now()
    conn.execute(
        "INSERT INTO refunds VALUES (?, ?, ?, ?, ?, 'succeeded', ?, ?, ?, ?)",
        (
            refund_id,
            order_id,
            amount,
            order["currency"],
            reason,
            call.request_id,
            call.idempotency_key,
            at,
            ts,
        ),
    )
    conn.execute(
        "UPDATE orders SET refunded_cents = refunded_cents + ? WHERE id = ?", (amount, order_id)
    )
    refund = refund_view(_get(conn, "refunds", refund_id, "not_found"))
    _record(conn, call, "refund.create", refund, at, refund_id)
    return Reply(201, refund)


def lookup_refund(conn: sqlite3.Connection, call: Call) -> Reply:
    return _lookup(conn, call, "refunds", refund_view)


def get_refund(conn: sqlite3.Connection, call: Call) -> Reply:
    return Reply(
        200, refund_view(_get(conn, "refunds", call.path_params["refund_id"], "refund_not_found"))
    )


def get_order(conn: sqlite3.Connection, call: Call) -> Reply:
    order = dict(_get(conn, "orders", call.path_params["order_id"], "order_not_found"))
    refunds = conn.execute(
        "SELECT * FROM refunds WHERE order_id = ? ORDER BY created_ts, rowid", (order["id"],)
    ).fetchall()
    order["refundable_cents"] = order["captured_cents"] - order["refunded_cents"]
    order["refunds"] = [refund_view(r) for r in refunds]
    return Reply(200, order)


# -- warehouse -----------------------------------------------------------------------------------


def get_warehouse(conn: sqlite3.Connection, call: Call) -> Reply:
    warehouse = _get(conn, "warehouses", call.path_params["warehouse_id"], "warehouse_not_found")
    stock = conn.execute(
        "SELECT sku, available FROM stock WHERE warehouse_id = ? ORDER BY sku", (warehouse["id"],)
    ).fetchall()
    return Reply(
        200,
        {
            "id": warehouse["id"],
            "tenant": warehouse["tenant"],
            "stock": {r["sku"]: r["available"] for r in stock},
        },
    )


def create_reservation(conn: sqlite3.Connection, call: Call) -> Reply:
    warehouse_id = require_str(call.body, "warehouse_id")
    sku = require_str(call.body, "sku")
    quantity = require_positive_int(call.body, "quantity")
    order_id = require_str(call.body, "order_id")
    _get(conn, "warehouses", warehouse_id, "warehouse_not_found")
    stock = conn.execute(
        "SELECT available FROM stock WHERE warehouse_id = ? AND sku = ?", (warehouse_id, sku)
    ).fetchone()
    if stock is None:
        raise ApiError(404, "sku_not_found", f"{sku!r} is not stocked in {warehouse_id}")
    if stock["available"] < quantity:
        raise ApiError(
            409,
            "out_of_stock",
            f"{quantity} x {sku} requested, {stock['available']} available in {warehouse_id}",
        )
    reservation_id = new_id("rsv")
    at, ts = utc_now()
    conn.execute(
        "UPDATE stock SET available = available - ? WHERE warehouse_id = ? AND sku = ?",
        (quantity, warehouse_id, sku),
    )
    conn.execute(
        "INSERT INTO reservations VALUES (?, ?, ?, ?, ?, 'reserved', ?, ?, ?, ?, NULL)",
        (
            reservation_id,
            warehouse_id,
            sku,
            quantity,
            order_id,
            call.request_id,
            call.idempotency_key,
            at,
            ts,
        ),
    )
    reservation = reservation_view(_get(conn, "reservations", reservation_id, "not_found"))
    _record(conn, call, "reservation.create", reservation, at, reservation_id)
    return Reply(201, reservation)


def release_reservation(conn: sqlite3.Connection, call: Call) -> Reply:
    reservation_id = call.path_params["reservation_id"]
    row = _get(conn, "reservations", reservation_id, "reservation_not_found")
    if row["status"] == "released":
        # Naturally idempotent: answer the same result, but no second effect or ledger row.
        return Reply(200, reservation_view(row))
    at, _ = utc_now()
    conn.execute(
        "UPDATE reservations SET status = 'released', released_at = ? WHERE id = ?",
        (at, reservation_id),
    )
    conn.execute(
        "UPDATE stock SET available = available + ? WHERE warehouse_id = ? AND sku = ?",
        (row["quantity"], row["warehouse_id"], row["sku"]),
    )
    reservation = reservation_view(_get(conn, "reservations", reservation_id, "not_found"))
    _record(conn, call, "reservation.release", reservation, at, reservation_id)
    return Reply(200, reservation)


def lookup_reservation(conn: sqlite3.Connection, call: Call) -> Reply:
    return _lookup(conn, call, "reservations", reservation_view)


def get_reservation(conn: sqlite3.Connection, call: Call) -> Reply:
    return Reply(
        200,
        reservation_view(
            _get(conn, "reservations", call.path_params["reservation_id"], "reservation_not_found")
        ),
    )


def get_warranty(conn: sqlite3.Connection, call: Call) -> Reply:
    order_id = call.path_params["order_id"]
    row = conn.execute(f"{WARRANTY_SELECT} WHERE w.order_id = ?", (order_id,)).fetchone()
    if row is None:
        raise ApiError(404, "order_not_found", f"{order_id!r} does not exist")
    return Reply(200, warranty_view(row))


# -- carrier -------------------------------------------------------------------------------------


def create_waybill(conn: sqlite3.Connection, call: Call) -> Reply:
    order_id = require_str(call.body, "order_id")
    address_id = require_str(call.body, "address_id")
    reservation_id = optional_str(call.body, "reservation_id")
    address = _get(conn, "addresses", address_id, "address_not_found")
    if not address["valid"]:
        raise ApiError(
            422,
            "address_invalid",
            f"address {address_id} has an invalid postal code {address['postal_code']!r}",
        )
    waybill_id = new_id("wb")
    at, ts = utc_now()
    conn.execute(
        "INSERT INTO waybills VALUES (?, ?, ?, ?, 'created', ?, ?, ?, NULL)",
        (waybill_id, order_id, address_id, reservation_id, call.request_id, at, ts),
    )
    waybill = waybill_view(_get(conn, "waybills", waybill_id, "not_found"))
    _record(conn, call, "waybill.create", waybill, at, waybill_id)
    return Reply(201, waybill)


def cancel_waybill(conn: sqlite3.Connection, call: Call) -> Reply:
    waybill_id = call.path_params["waybill_id"]
    row = _get(conn, "waybills", waybill_id, "waybill_not_found")
    if row["status"] == "cancelled":
        return Reply(200, waybill_view(row))
    at, _ = utc_now()
    conn.execute(
        "UPDATE waybills SET status = 'cancelled', cancelled_at = ? WHERE id = ?", (at, waybill_id)
    )
    waybill = waybill_view(_get(conn, "waybills", waybill_id, "not_found"))
    _record(conn, call, "waybill.cancel", waybill, at, waybill_id)
    return Reply(200, waybill)


def lookup_waybill(conn: sqlite3.Connection, call: Call) -> Reply:
    return _lookup(conn, call, "waybills", waybill_view, by_key=False)


def get_waybill(conn: sqlite3.Connection, call: Call) -> Reply:
    return Reply(
        200,
        waybill_view(_get(conn, "waybills", call.path_params["waybill_id"], "waybill_not_found")),
    )


def get_address(conn: sqlite3.Connection, call: Call) -> Reply:
    return Reply(
        200,
        address_view(_get(conn, "addresses", call.path_params["address_id"], "address_not_found")),
    )


# -- mailer --------------------------------------------------------------------------------------


def email_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "message_id": row["id"],
        "to": row["to_address"],
        "subject": row["subject"],
        "body": row["body"],
        "status": row["status"],
        "request_id": row["request_id"],
        "idempotency_key": row["idempotency_key"],
        "created_at": row["created_at"],
    }


def send_email(conn: sqlite3.Connection, call: Call) -> Reply:
    to = require_str(call.body, "to")
    if "@" not in to:
        raise invalid("to must be an email address")
    subject = require_str(call.body, "subject")
    body = call.body.get("body")
    if not isinstance(body, str):
        raise invalid("body is required and must be a string")
    message_id = new_id("msg")
    at, ts = utc_now()
    conn.execute(
        "INSERT INTO emails VALUES (?, ?, ?, ?, 'sent', ?, ?, ?, ?)",
        (message_id, to, subject, body, call.request_id, call.idempotency_key, at, ts),
    )
    email = email_view(_get(conn, "emails", message_id, "not_found"))
    _record(conn, call, "email.send", email, at, message_id)
    return Reply(202, email)


def lookup_email(conn: sqlite3.Connection, call: Call) -> Reply:
    return _lookup(conn, call, "emails", email_view)


def get_email(conn: sqlite3.Connection, call: Call) -> Reply:
    return Reply(
        200, email_view(_get(conn, "emails", call.path_params["message_id"], "message_not_found"))
    )


# Order matters: literal "lookup" segments must match before the "{id}" patterns.
ROUTES: dict[str, tuple[Route, ...]] = {
    "payments": (
        _route("POST", "/refunds", create_refund),
        _route("GET", "/refunds/lookup", lookup_refund),
        _route("GET", "/refunds/{refund_id}", get_refund),
        _route("GET", "/orders/{order_id}", get_order),
    ),
    "warehouse": (
        _route("GET", "/warehouses/{warehouse_id}", get_warehouse),
        _route("POST", "/reservations", create_reservation),
        _route("GET", "/reservations/lookup", lookup_reservation),
        _route("POST", "/reservations/{reservation_id}/release", release_reservation),
        _route("GET", "/reservations/{reservation_id}", get_reservation),
        _route("GET", "/warranty/{order_id}", get_warranty),
    ),
    "carrier": (
        _route("POST", "/waybills", create_waybill),
        _route("GET", "/waybills/lookup", lookup_waybill),
        _route("POST", "/waybills/{waybill_id}/cancel", cancel_waybill),
        _route("GET", "/waybills/{waybill_id}", get_waybill),
        _route("GET", "/addresses/{address_id}", get_address),
    ),
    "mailer": (
        _route("POST", "/emails", send_email),
        _route("GET", "/emails/lookup", lookup_email),
        _route("GET", "/emails/{message_id}", get_email),
    ),
}
