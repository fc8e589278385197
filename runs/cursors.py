"""The hand-written statements' cursors: one kept per statement and connection, so that
neither Django nor psycopg makes a cursor (and psycopg its adapters) for each run of the hot
paths' statements (runs/sql.py, toolcalls/sql*.py). tests/test_runs_sql_cursor.py."""

from __future__ import annotations

from datetime import UTC
from typing import Any


def cursor_for(conn: Any, statement: str | None = None) -> Any:
    """`conn.cursor()`, or the one it gave last time for `statement` while what would make it
    another is unchanged: the same database connection, its health check done (or none
    asked), the same logging of queries (a debug cursor records them) and time zone. Making
    one is ~43 µs of CPU (Django's checks and wrapper, psycopg's cursor) and a proposal made
    five. It is not closed: a caller fetches what it reads before that statement runs again.

    One cursor per statement (None: one for any): psycopg keeps a cursor's adapters (its
    Transformer: the dumpers of the parameters' types, the loaders of the columns') while it
    runs the same statement object again, and makes new ones for another statement (about
    ten Python calls per statement, tests/test_runs_sql_cursor.py)."""
    kept = getattr(conn, "_kept_cursors", None)
    if kept is None or not (
        kept[0] is conn.connection
        and (conn.health_check_done or not conn.health_check_enabled)
        and kept[1] == conn.queries_logged
        and kept[2] is conn.timezone
    ):
        # The connection is read after the first cursor is made: making it may connect (a
        # closed one is None until then) or reconnect (a failed health check), and the kept
        # cursors belong to the connection it leaves, not to the one before.
        cursor = _made(conn)
        made = {statement: cursor}
        conn._kept_cursors = (conn.connection, conn.queries_logged, conn.timezone, made)
        return cursor
    cursors = kept[3]
    cursor = cursors.get(statement)
    if cursor is None:
        if len(cursors) >= _MAX_KEPT_CURSORS:
            cursors.clear()  # a caller passing statements made anew each time
        cursor = cursors[statement] = _made(conn)
    return cursor


def _made(conn: Any) -> Any:
    cursor = conn.cursor()  # runs the health check, if one is due
    _load_timestamps_in_c(conn, cursor)
    return cursor


_MAX_KEPT_CURSORS = 64


def _load_timestamps_in_c(conn: Any, cursor: Any) -> None:
    """The kept cursor reads timestamptz with psycopg's own (C) loader. Django's replaces the
    loaded value's tzinfo with the connection's time zone, and so must be a Python subclass
    of psycopg's Python loader: ~5 µs and six Python calls per value, 13 values per call
    locked (a dispatched call's rows are read twice; profile_dispatch --profile). Where the
    session's time zone is UTC and Django's is UTC too, psycopg's loader already gives the
    same value with the same tzinfo (`datetime.timezone.utc`): only then is it used.
    tests/test_runs_sql_cursor.py compares the two."""
    if conn.vendor != "postgresql" or conn.timezone is not UTC:
        return
    raw = getattr(cursor, "cursor", None)  # a debug cursor wraps the wrapper's own
    pg = getattr(raw, "connection", None)
    if pg is None or getattr(pg.info, "timezone", None) is not UTC:
        return
    import psycopg  # PostgreSQL's driver: not needed where the database is another

    oid = psycopg.postgres.types["timestamptz"].oid
    raw.adapters.register_loader(oid, psycopg.adapters.get_loader(oid, psycopg.pq.Format.TEXT))
