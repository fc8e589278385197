"""The sandbox's seed data: orders, warranties, warehouses and stock, addresses, and the
seeded reservation and waybill; identical on every start. Extra tenants (`--extra-tenant`) get
their own orders, warehouse and addresses after the standard seed."""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime

SKUS = ("PART-100", "PART-200", "PART-300")


def seed_captured_cents(n: int) -> int:
    """Captured amount of order-NNN: three fixed amounts the demo relies on, then a spread.

    The spread is a plain formula (not ``random``) so it is identical on every Python version:
    multiples of $1 between 5000 and 200000 cents.
    """
    fixed = {1: 12_000, 2: 35_000, 3: 150_000}
    if n in fixed:
        return fixed[n]
    return 5_000 + (n * 7_919 % 1_951) * 100


# Fixed dates, never relative to "now", so the seed is identical on every start; whether a
# warranty is still valid is decided against the current date when it is read.
WARRANTY_VALID_UNTIL = "2036-06-30"
WARRANTY_EXPIRED = {7: "2024-03-31", 13: "2024-11-30"}


def seed_warranty(n: int) -> tuple[str, str]:
    """(sku, expires_on) of order-NNN's purchased part: SKUs cycle PART-100, PART-200, PART-300."""
    return SKUS[(n - 1) % len(SKUS)], WARRANTY_EXPIRED.get(n, WARRANTY_VALID_UNTIL)


# Pre-existing objects, so API examples ("release rsv_seed0001", "cancel wb_seed0001") refer to
# real data. They are seed state, not effects: no ledger rows. Fixed timestamp, like the
# warranty dates, so the seed is identical on every start (and never hidden by look-up lag).
SEED_CREATED_AT = "2025-01-01T00:00:00.000Z"
SEED_CREATED_TS = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
# (id, warehouse_id, sku, quantity, order_id, request_id); status "reserved", no idempotency key.
SEED_RESERVATIONS = (("rsv_seed0001", "wh-acme-1", "PART-200", 1, "order-010", "req_seed0001"),)
# (id, order_id, address_id, reservation_id, request_id); status "created".
SEED_WAYBILLS = (("wb_seed0001", "order-010", "addr-001", "rsv_seed0001", "req_seed0002"),)


# long: the whole standard seed in one place, in the order sandbox/README.md lists it
def seed(conn: sqlite3.Connection) -> None:
    for n in range(1, 21):
        conn.execute(
            "INSERT INTO orders VALUES (?, ?, ?, 'USD', ?, 0)",
            (
                f"order-{n:03d}",
                "acme" if n <= 15 else "globex",
                f"customer-{n:03d}@example.com",
                seed_captured_cents(n),
            ),
        )
        conn.execute(
            "INSERT INTO warranties VALUES (?, ?, ?)", (f"order-{n:03d}", *seed_warranty(n))
        )
    for warehouse_id, tenant in (
        ("wh-acme-1", "acme"),
        ("wh-acme-2", "acme"),
        ("wh-globex-1", "globex"),
    ):
        conn.execute("INSERT INTO warehouses VALUES (?, ?)", (warehouse_id, tenant))
        for sku in SKUS:
            # A single PART-300 in wh-acme-1 lets tests and the demo hit out_of_stock.
            available = 1 if (warehouse_id, sku) == ("wh-acme-1", "PART-300") else 50
            conn.execute("INSERT INTO stock VALUES (?, ?, ?)", (warehouse_id, sku, available))
    for n in range(1, 11):
        conn.execute(
            "INSERT INTO addresses VALUES (?, 'acme', ?, ?, 'Springfield', ?, 'US', 1)",
            (f"addr-{n:03d}", f"Customer {n:03d}", f"{n * 10} Main Street", f"{62700 + n}"),
        )
    conn.execute(
        "INSERT INTO addresses VALUES ('addr-bad-001', 'acme', 'Nobody', '1 Nowhere Road',"
        " 'Springfield', '0000X', 'US', 0)"
    )
    for reservation_id, warehouse_id, sku, quantity, order_id, request_id in SEED_RESERVATIONS:
        conn.execute(
            "INSERT INTO reservations VALUES (?, ?, ?, ?, ?, 'reserved', ?, NULL, ?, ?, NULL)",
            (
                reservation_id,
                warehouse_id,
                sku,
                quantity,
                order_id,
                request_id,
                SEED_CREATED_AT,
                SEED_CREATED_TS,
            ),
        )
        # The stock reflects the reservation, exactly as if it had been made through the API.
        conn.execute(
            "UPDATE stock SET available = available - ? WHERE warehouse_id = ? AND sku = ?",
            (quantity, warehouse_id, sku),
        )
    for waybill_id, order_id, address_id, reservation_id, request_id in SEED_WAYBILLS:
        conn.execute(
            "INSERT INTO waybills VALUES (?, ?, ?, ?, 'created', ?, ?, ?, NULL)",
            (
                waybill_id,
                order_id,
                address_id,
                reservation_id,
                request_id,
                SEED_CREATED_AT,
                SEED_CREATED_TS,
            ),
        )


EXTRA_TENANT_ORDERS = 20
# Order numbers stay three digits (the contracts' `order-NNN`): 21 + 20 * 49 would pass 999.
MAX_EXTRA_TENANTS = 48
EXTRA_TENANT_SLUG = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def seed_extra_tenant(conn: sqlite3.Connection, index: int, slug: str) -> None:
    """Tenant number `index` beyond acme and globex: 20 orders numbered on from order-021
    (captured amounts and warranties as for the others), a warehouse `wh-<slug>-1` with 50 of
    each SKU and five valid addresses `addr-<slug>-001`…`005`."""
    first = 21 + EXTRA_TENANT_ORDERS * index
    for n in range(first, first + EXTRA_TENANT_ORDERS):
        conn.execute(
            "INSERT INTO orders VALUES (?, ?, ?, 'USD', ?, 0)",
            (f"order-{n:03d}", slug, f"customer-{n:03d}@example.com", seed_captured_cents(n)),
        )
        conn.execute(
            "INSERT INTO warranties VALUES (?, ?, ?)", (f"order-{n:03d}", *seed_warranty(n))
        )
    conn.execute("INSERT INTO warehouses VALUES (?, ?)", (f"wh-{slug}-1", slug))
    for sku in SKUS:
        conn.execute("INSERT INTO stock VALUES (?, ?, 50)", (f"wh-{slug}-1", sku))
    for n in range(1, 6):
        conn.execute(
            "INSERT INTO addresses VALUES (?, ?, ?, ?, 'Springfield', ?, 'US', 1)",
            (f"addr-{slug}-{n:03d}", slug, f"Customer {n:03d}", f"{n} Elm Street", f"{62800 + n}"),
        )


def check_extra_tenants(slugs: list[str] | tuple[str, ...]) -> None:
    """Raise ValueError unless these can be seeded as extra tenants."""
    for slug in slugs:
        if not EXTRA_TENANT_SLUG.match(slug) or slug in ("acme", "globex"):
            raise ValueError(f"{slug!r}: an extra tenant is a new lowercase slug (a-z, 0-9, -)")
    if len(set(slugs)) > MAX_EXTRA_TENANTS:
        raise ValueError(f"at most {MAX_EXTRA_TENANTS} extra tenants")
