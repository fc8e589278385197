"""ANALYZE the benchmark's tables as autovacuum would, when the server's autovacuum is off.

Without statistics the planner cannot tell a unique index from one that merely begins with the
same column: on never-analyzed tables it read the proposal's idempotency key through
`toolcall_obj` (every call of the tenant, 1,286 rows fetched per call) and a run through its
tenant's index (every run). A server with autovacuum on analyzes a table once
`autovacuum_analyze_threshold + autovacuum_analyze_scale_factor * reltuples` rows changed, so
the plans the benchmark should measure are those of analyzed tables; with autovacuum off (as on
the shared development server) nothing ever does, and the figures were those of the first
seconds of a new database. This thread applies autovacuum's rule every `interval` seconds, on
a connection of its own whose statements the benchmark takes out of its counts, as it does the
waiting loop's (their server CPU stays in, as autovacuum's would)."""

from __future__ import annotations

import threading

import psycopg

# autovacuum_analyze_threshold, autovacuum_analyze_scale_factor: read from the server.
_DUE = (
    "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
    " WHERE n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::int"
    " + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0)"
)


class AutoAnalyze(threading.Thread):
    def __init__(self, conninfo: str, interval: float = 1.0) -> None:
        super().__init__(name="bench-autoanalyze", daemon=True)
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.interval = interval
        self.statements = 1
        self.off = self.conn.execute("SHOW autovacuum").fetchone()[0] == "off"
        self.analyzed: dict[str, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while self.off and not self._halt.wait(self.interval):
                self.analyze_due()
        except psycopg.Error as exc:  # reported, not raised: the run goes on without it
            self.analyzed[f"stopped by {type(exc).__name__}"] = 1

    def analyze_due(self) -> None:
        self.statements += 1
        for (table,) in self.conn.execute(_DUE).fetchall():
            self.statements += 1
            self.conn.execute(f'ANALYZE "{table}"')
            self.analyzed[table] = self.analyzed.get(table, 0) + 1

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()
        self.conn.close()


def describe(analyzed: dict[str, int] | None) -> str:
    """For the report: who analyzed the tables during the run."""
    if analyzed is None:
        return "the server's autovacuum analyzes the tables"
    done = ", ".join(f"{table} {n}" for table, n in sorted(analyzed.items())) or "none due"
    return f"autovacuum is off: the benchmark ran its ANALYZE rule every 1 s ({done})"
