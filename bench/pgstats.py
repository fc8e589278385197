"""PostgreSQL side of the benchmark: its own databases and server-side counters."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

DB_COUNTERS = (
    "xact_commit",
    "xact_rollback",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "tup_fetched",
    "tup_returned",
    "blks_hit",
    "blks_read",
)


def with_database(url: str, name: str, scheme: str = "postgres") -> str:
    """The same server and credentials, another database."""
    parts = urlsplit(url)
    return urlunsplit((scheme, parts.netloc, f"/{name}", "", ""))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def admin_conninfo(url: str) -> str:
    return with_database(url, "postgres", scheme="postgresql")


def conninfo(url: str) -> str:
    return with_database(url, database_name(url), scheme="postgresql")


def recreate_database(url: str, name: str) -> None:
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        # FORCE: a previous run killed mid-way may have left sessions behind.
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def ensure_database(url: str, name: str) -> bool:
    """Create the database if missing; True when it was created."""
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return not exists


def create_marked_database(url: str, name: str, marker: str) -> None:
    """Create the database with `marker` as its comment: proof, later, that we made it."""
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(name), sql.Literal(marker)
            )
        )


def database_comment(url: str, name: str) -> str | None:
    """None when there is no such database; its comment ('' for none) otherwise."""
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database"
            " WHERE datname = %s",
            [name],
        ).fetchone()
    return None if row is None else row[0]


def drop_database(url: str, name: str) -> None:
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def database_counters(url: str, name: str) -> dict[str, int]:
    """pg_stat_database of one database, read from the `postgres` database (so the read itself
    does not count) on a fresh connection (so no cached statistics snapshot)."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in DB_COUNTERS)
    query = sql.SQL("SELECT {} FROM pg_stat_database WHERE datname = %s").format(columns)
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        row = conn.execute(query, [name]).fetchone()
    return dict(zip(DB_COUNTERS, row, strict=True))


def table_counters(url: str) -> dict[str, dict[str, int]]:
    """Per-table inserts, updates and scans in the benchmark database (one statement)."""
    query = (
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,"
        " coalesce(idx_scan, 0) + coalesce(seq_scan, 0) FROM pg_stat_user_tables"
    )
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        rows = conn.execute(query).fetchall()
    return {
        r[0]: {"ins": r[1], "upd": r[2], "hot_upd": r[3], "del": r[4], "scans": r[5]} for r in rows
    }


def pg_stat_statements_state(url: str) -> str:
    """'' when pg_stat_statements can count statements here, else why it cannot."""
    with psycopg.connect(admin_conninfo(url), autocommit=True) as conn:
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        available = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
        ).fetchone()
    if "pg_stat_statements" in preload:
        return ""
    if not available:
        return "pg_stat_statements is not installed on this server"
    return (
        "pg_stat_statements is installed but not in shared_preload_libraries "
        "(needs a server restart; not done here since other work shares this server)"
    )


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def statements_reset(url: str) -> bool:
    """With pg_stat_statements loaded: create it in the benchmark database and zero its counts
    for that database. False when it cannot be used."""
    try:
        with psycopg.connect(conninfo(url), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(
                "SELECT pg_stat_statements_reset(0, "
                "(SELECT oid FROM pg_database WHERE datname = current_database()), 0)"
            )
        return True
    except psycopg.Error:
        return False


def statements_count(url: str) -> int:
    # In the benchmark database: the view exists where `statements_reset` created the
    # extension (the server-wide `postgres` database may have none).
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
            [database_name(url)],
        ).fetchone()
    return int(row[0])
