"""SQLite persistence for the sandbox: schema, deterministic seed data, ledger, idempotency.

One connection guarded by one re-entrant lock. SQLite statements take microseconds, so a single
connection is simpler than a pool and fast enough for the benchmark; the lock also gives the
"writes are serialized" guarantee that idempotency under concurrency relies on.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

DB_FILENAME = "sandbox.sqlite3"

SCHEMA = """
CREATE TABLE orders (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    customer_email TEXT NOT NULL,
    currency TEXT NOT NULL,
    captured_cents INTEGER NOT NULL,
    refunded_cents INTEGER NOT NULL
);
CREATE TABLE refunds (
    id TEXT PRIMARY KEY,
    order_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    currency TEXT NOT NULL,
    reason TEXT,
    status TEXT NOT NULL,
    request_id TEXT NOT NULL,
    idempotency_key TEXT,
    created_at TEXT NOT NULL,
    created_ts REAL NOT NULL
);
CREATE INDEX refunds_order ON refunds(order_id);
CREATE INDEX refunds_request ON refunds(request_id);
CREATE INDEX refunds_key ON refunds(idempotency_key);

CREATE TABLE warehouses (id TEXT PRIMARY KEY, tenant TEXT NOT NULL);
CREATE TABLE stock (
    warehouse_id TEXT NOT NULL,
    sku TEXT NOT NULL,
    available INTEGER NOT NULL,
    PRIMARY KEY (warehouse_id, sku)
);
CREATE TABLE reservations (
    id TEXT PRIMARY KEY,
    warehouse_id TEXT NOT NULL,
    sku TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    order_id TEXT NOT NULL,
    status TEXT NOT NULL,
    request_id TEXT NOT NULL,
    idempotency_key TEXT,
    created_at TEXT NOT NULL,
    created_ts REAL NOT NULL,
    released_at TEXT
);
CREATE INDEX reservations_request ON reservations(request_id);
CREATE INDEX reservations_key ON reservations(idempotency_key);
-- One purchased part per order (in_warranty is derived from expires_on at request time).
CREATE TABLE warranties (
    order_id TEXT PRIMARY KEY,
    sku TEXT NOT NULL,
    expires_on TEXT NOT NULL
);

CREATE TABLE addresses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    street TEXT NOT NULL,
    city TEXT NOT NULL,
    postal_code TEXT NOT NULL,
    country TEXT NOT NULL,
    valid INTEGER NOT NULL
);
CREATE TABLE waybills (
    id TEXT PRIMARY KEY,
    order_id TEXT NOT NULL,
    address_id TEXT NOT NULL,
    reservation_id TEXT,
    status TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    created_ts REAL NOT NULL,
    cancelled_at TEXT
);
CREATE INDEX waybills_request ON waybills(request_id);

CREATE TABLE emails (
    id TEXT PRIMARY KEY,
    to_address TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    status TEXT NOT NULL,
    request_id TEXT NOT NULL,
    idempotency_key TEXT,
    created_at TEXT NOT NULL,
    created_ts REAL NOT NULL
);
CREATE INDEX emails_request ON emails(request_id);
CREATE INDEX emails_key ON emails(idempotency_key);

CREATE TABLE ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    system TEXT NOT NULL,
    operation TEXT NOT NULL,
    resource_id TEXT NOT NULL,
    request_id TEXT,
    idempotency_key TEXT,
    payload TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX ledger_system ON ledger(system, seq);

-- The first successful response per (system, key), replayed verbatim on a matching retry.
CREATE TABLE idempotency (
    system TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status INTEGER NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (system, key)
);

CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

TABLES = (
    "orders",
    "refunds",
    "warehouses",
    "stock",
    "reservations",
    "warranties",
    "addresses",
    "waybills",
    "emails",
    "ledger",
    "idempotency",
    "meta",
)

# Bumped whenever SCHEMA changes incompatibly; an older file is then re-created and re-seeded.
SCHEMA_VERSION = "3"

SKUS = ("PART-100", "PART-200", "PART-300")


def utc_now() -> tuple[str, float]:
    """Current time as (ISO-8601 UTC string with milliseconds, epoch seconds)."""
    ts = time.time()
    iso = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return iso.replace("+00:00", "Z"), ts


def new_id(prefix: str) -> str:
    """Opaque resource id such as ``re_3f9c...``; random so ids never repeat across resets."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


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


def _seed(conn: sqlite3.Connection) -> None:
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
    conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))


@dataclass(frozen=True)
class StoredResponse:
    """A response kept for idempotent replay."""

    fingerprint: str
    status: int
    body: str


class Store:
    """The sandbox database. All access goes through ``transaction()`` or ``read()``."""

    def __init__(self, data_dir: str | Path, *, reset: bool = False) -> None:
        self.path = Path(data_dir) / DB_FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so a transaction spans exactly
        # one write request (idempotency check + effect + ledger row + stored response).
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        if reset or not self._is_current():
            self.reset()

    def _is_current(self) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if row is None:
            return False
        version = self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return version is not None and version["value"] == SCHEMA_VERSION

    def reset(self) -> None:
        """Drop everything and seed afresh.

        DROP TABLE also removes the ledger's AUTOINCREMENT counter, so ``seq`` restarts at 1.
        """
        with self.transaction() as conn:
            for table in TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            # Split by hand: executescript() would COMMIT the open transaction first.
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            _seed(conn)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Serialized write transaction: commits on success, rolls back on any exception."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Read access; takes the same lock because the connection is shared between threads."""
        with self._lock:
            yield self._conn

    def close(self) -> None:
        # Taking the lock first lets an in-flight transaction finish before the file closes.
        with self._lock:
            self._conn.close()

    # -- ledger ------------------------------------------------------------------------------

    @staticmethod
    def append_effect(
        conn: sqlite3.Connection,
        *,
        system: str,
        operation: str,
        resource_id: str,
        request_id: str | None,
        idempotency_key: str | None,
        payload: dict[str, Any],
        at: str,
    ) -> None:
        conn.execute(
            "INSERT INTO ledger (system, operation, resource_id, request_id, idempotency_key,"
            " payload, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                system,
                operation,
                resource_id,
                request_id,
                idempotency_key,
                json.dumps(payload, sort_keys=True),
                at,
            ),
        )

    def ledger(self, system: str | None = None) -> list[dict[str, Any]]:
        with self.read() as conn:
            if system is None:
                rows = conn.execute("SELECT * FROM ledger ORDER BY seq").fetchall()
            else:
                rows = conn.execute(
                    "SELECT * FROM ledger WHERE system = ? ORDER BY seq", (system,)
                ).fetchall()
        return [{**dict(row), "payload": json.loads(row["payload"])} for row in rows]

    # -- idempotency -------------------------------------------------------------------------

    @staticmethod
    def stored_response(conn: sqlite3.Connection, system: str, key: str) -> StoredResponse | None:
        row = conn.execute(
            "SELECT fingerprint, status, body FROM idempotency WHERE system = ? AND key = ?",
            (system, key),
        ).fetchone()
        return (
            None if row is None else StoredResponse(row["fingerprint"], row["status"], row["body"])
        )

    @staticmethod
    def store_response(
        conn: sqlite3.Connection, system: str, key: str, fingerprint: str, status: int, body: str
    ) -> None:
        conn.execute(
            "INSERT INTO idempotency VALUES (?, ?, ?, ?, ?, ?)",
            (system, key, fingerprint, status, body, utc_now()[0]),
        )

    # -- seed-data view ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything GET /data shows: orders, warehouses with stock, addresses, warranties, and
        the seeded reservations and waybills in their current state (not API-created ones)."""
        with self.read() as conn:
            orders = [dict(r) for r in conn.execute("SELECT * FROM orders ORDER BY id")]
            warehouses = [dict(r) for r in conn.execute("SELECT * FROM warehouses ORDER BY id")]
            stock = conn.execute("SELECT * FROM stock ORDER BY warehouse_id, sku").fetchall()
            addresses = [
                address_view(r) for r in conn.execute("SELECT * FROM addresses ORDER BY id")
            ]
            warranties = [
                warranty_view(r) for r in conn.execute(f"{WARRANTY_SELECT} ORDER BY w.order_id")
            ]
            reservations = [
                reservation_view(r)
                for r in _rows_by_id(conn, "reservations", [s[0] for s in SEED_RESERVATIONS])
            ]
            waybills = [
                waybill_view(r)
                for r in _rows_by_id(conn, "waybills", [s[0] for s in SEED_WAYBILLS])
            ]
        for warehouse in warehouses:
            warehouse["stock"] = {
                r["sku"]: r["available"] for r in stock if r["warehouse_id"] == warehouse["id"]
            }
        return {
            "orders": orders,
            "warehouses": warehouses,
            "addresses": addresses,
            "warranties": warranties,
            "reservations": reservations,
            "waybills": waybills,
        }


def _rows_by_id(conn: sqlite3.Connection, table: str, ids: list[str]) -> list[sqlite3.Row]:
    placeholders = ", ".join("?" * len(ids))
    return conn.execute(
        f"SELECT * FROM {table} WHERE id IN ({placeholders}) ORDER BY id", ids
    ).fetchall()


def reservation_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "reservation_id": row["id"],
        "warehouse_id": row["warehouse_id"],
        "sku": row["sku"],
        "quantity": row["quantity"],
        "order_id": row["order_id"],
        "status": row["status"],
        "request_id": row["request_id"],
        "idempotency_key": row["idempotency_key"],
        "created_at": row["created_at"],
        "released_at": row["released_at"],
    }


def waybill_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "waybill_id": row["id"],
        "order_id": row["order_id"],
        "address_id": row["address_id"],
        "reservation_id": row["reservation_id"],
        "status": row["status"],
        "request_id": row["request_id"],
        "created_at": row["created_at"],
        "cancelled_at": row["cancelled_at"],
    }


def address_view(row: sqlite3.Row) -> dict[str, Any]:
    return {**dict(row), "valid": bool(row["valid"])}


# The tenant is the order's; warranties carry no tenant of their own.
WARRANTY_SELECT = (
    "SELECT w.order_id, o.tenant, w.sku, w.expires_on"
    " FROM warranties w JOIN orders o ON o.id = w.order_id"
)


def warranty_view(row: sqlite3.Row, today: date | None = None) -> dict[str, Any]:
    """The warranty as the API shows it; valid through its expiry day (UTC date)."""
    today = today or datetime.now(UTC).date()
    return {
        "order_id": row["order_id"],
        "tenant": row["tenant"],
        "sku": row["sku"],
        "warranty_expires_on": row["expires_on"],
        "in_warranty": today <= date.fromisoformat(row["expires_on"]),
    }
