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

from .seed import (
    MAX_EXTRA_TENANTS,
    SEED_RESERVATIONS,
    SEED_WAYBILLS,
    check_extra_tenants,
    seed,
    seed_extra_tenant,
)

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


def utc_now() -> tuple[str, float]:
    """Current time as (ISO-8601 UTC string with milliseconds, epoch seconds)."""
    ts = time.time()
    iso = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return iso.replace("+00:00", "Z"), ts


def new_id(prefix: str) -> str:
    """Opaque resource id such as ``re_3f9c...``; random so ids never repeat across resets."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class StoredResponse:
    """A response kept for idempotent replay."""

    fingerprint: str
    status: int
    body: str


class Store:
    """The sandbox database. All access goes through ``transaction()`` or ``read()``."""

    def __init__(
        self, data_dir: str | Path, *, reset: bool = False, extra_tenants: tuple[str, ...] = ()
    ) -> None:
        check_extra_tenants(extra_tenants)
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
        self.add_extra_tenants(extra_tenants)

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
            extra = self._extra_tenants(conn) if self._is_current() else []
            for table in TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            # Split by hand: executescript() would COMMIT the open transaction first.
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            seed(conn)
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        self.add_extra_tenants(tuple(extra))

    @staticmethod
    def _extra_tenants(conn: sqlite3.Connection) -> list[str]:
        row = conn.execute("SELECT value FROM meta WHERE key = 'extra_tenants'").fetchone()
        return json.loads(row["value"]) if row else []

    def add_extra_tenants(self, slugs: tuple[str, ...]) -> None:
        """Seed each tenant not seeded yet (a reset seeds them again)."""
        with self.transaction() as conn:
            seeded = self._extra_tenants(conn)
            for slug in slugs:
                if slug not in seeded:
                    if len(seeded) >= MAX_EXTRA_TENANTS:
                        raise ValueError(f"at most {MAX_EXTRA_TENANTS} extra tenants")
                    seed_extra_tenant(conn, len(seeded), slug)
                    seeded.append(slug)
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('extra_tenants', ?)", (json.dumps(seeded),)
            )

    def add_orders(self, tenant: str, numbers: range, captured_cents: int) -> None:
        """Orders `order-NNN` for `numbers`, nothing refunded (a reset removes them again)."""
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO orders VALUES (?, ?, ?, 'USD', ?, 0)",
                (
                    (f"order-{n:03d}", tenant, f"customer-{n:03d}@example.com", captured_cents)
                    for n in numbers
                ),
            )

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
