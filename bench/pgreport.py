"""Where the benchmark database's server time goes: its top statements and its indexes' use.

Printed by bench_dispatch after its figures (issue 12 point 4: PostgreSQL's CPU per call). An
index that no statement scans still costs every INSERT an entry; one that is scanned often
but reads many rows per scan is a plan to look at.
"""

from __future__ import annotations

import psycopg

from bench import pgstats

TABLES = ("runs_event", "toolcalls_toolcall", "runs_outboxmessage", "toolcalls_attempt")

IndexCounters = dict[str, tuple[str, int, int]]


def index_counters(url: str) -> IndexCounters:
    """index name -> (its table, scans, index entries read), for the tables of TABLES."""
    query = (
        "SELECT indexrelname, relname, idx_scan, idx_tup_read FROM pg_stat_user_indexes"
        " WHERE relname = ANY(%s)"
    )
    with psycopg.connect(pgstats.conninfo(url), autocommit=True) as conn:
        rows = conn.execute(query, [list(TABLES)]).fetchall()
    return {name: (table, scans, read) for name, table, scans, read in rows}


def index_lines(before: IndexCounters, after: IndexCounters, calls: int) -> list[str]:
    """One line per table: each index's scans per call (and entries read per scan)."""
    lines = ["  index scans/call (entries read per scan) during the run:"]
    for table in TABLES:
        parts = []
        for name, (owner, scans, read) in sorted(after.items()):
            if owner != table:
                continue
            was = before.get(name, (owner, 0, 0))
            n, entries = scans - was[1], read - was[2]
            parts.append(f"{name} {n / calls:.2f}" + (f" ({entries / n:.1f})" if n else ""))
        lines.append(f"    {table} ({len(parts)} indexes): " + ", ".join(parts))
    return lines


def statement_lines(url: str, calls: int, limit: int = 12) -> list[str]:
    """The top statements by server time, per call: calls, ms, rows, buffer pages."""
    lines = [f"  top {limit} statements by server time (per call: calls, ms, rows, pages):"]
    for s in pgstats.top_statements(url, limit):
        lines.append(
            f"    {s['calls'] / calls:5.2f} {s['ms'] / calls:6.3f} {s['rows'] / calls:7.1f} "
            f"{s['blks'] / calls:7.1f}  {s['query'][:150]}"
        )
    return lines


def database_line(db: dict[str, int], commits: int, calls: int) -> str:
    """The database's counters per call (pg_stat_database deltas; `commits` with the
    benchmark's own taken out)."""
    return (
        f"    commits {commits / calls:.2f}, rollbacks {db['xact_rollback'] / calls:.2f}, "
        f"rows inserted {db['tup_inserted'] / calls:.2f}, updated "
        f"{db['tup_updated'] / calls:.2f}, fetched {db['tup_fetched'] / calls:.1f}"
    )


def table_line(before: dict[str, dict], after: dict[str, dict], calls: int) -> str:
    """Rows inserted and updated and scans per call, for each table the run touched."""
    rows = []
    for table, now in sorted(after.items()):
        was = before.get(table, {})
        ins, upd = now["ins"] - was.get("ins", 0), now["upd"] - was.get("upd", 0)
        scans = now["scans"] - was.get("scans", 0)
        if ins or upd or scans:
            rows.append(f"{table} +{ins / calls:.2f}/~{upd / calls:.2f}/scan {scans / calls:.1f}")
    return "    per table (ins/upd/index+seq scans): " + "; ".join(rows)
