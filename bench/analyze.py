"""VACUUM and ANALYZE the benchmark's tables as autovacuum would, when the server's autovacuum
is off.

Without statistics the planner cannot tell a unique index from one that merely begins with the
same column: on never-analyzed tables it read the proposal's idempotency key through
`toolcall_obj` (every call of the tenant, 1,286 rows fetched per call) and a run through its
tenant's index (every run). A server with autovacuum on analyzes a table once
`autovacuum_analyze_threshold + autovacuum_analyze_scale_factor * reltuples` rows changed, so
the plans the benchmark should measure are those of analyzed tables; with autovacuum off (as on
the shared development server) nothing ever does, and the figures were those of the first
seconds of a new database. Nor does anything VACUUM: the outbox's partial index of undone rows
fills with the entries of rows done, which each lease then walks. This thread applies
autovacuum's rules every `interval` seconds (VACUUM, ANALYZE), on
a connection of its own whose statements the benchmark takes out of its counts, as it does the
waiting loop's (their server CPU stays in, as autovacuum's would)."""

from __future__ import annotations

import threading

import psycopg


def _over(counter: str, setting: str) -> str:
    """autovacuum's test: `counter` past its threshold plus scale factor times the rows."""
    return (
        f"{counter} > current_setting('autovacuum_{setting}_threshold')::int"
        f" + current_setting('autovacuum_{setting}_scale_factor')::float8"
        " * greatest(c.reltuples, 0)"
    )


# Each table due: its name, and whether a VACUUM is due (dead rows, or rows inserted since the
# last one) besides the ANALYZE. The settings are the server's.
_VACUUM = f"{_over('n_dead_tup', 'vacuum')} OR {_over('n_ins_since_vacuum', 'vacuum_insert')}"
_DUE = (
    f"SELECT s.schemaname, s.relname, {_VACUUM}"
    " FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
    f" WHERE {_VACUUM} OR {_over('n_mod_since_analyze', 'analyze')}"
)


class AutoAnalyze(threading.Thread):
    def __init__(self, conninfo: str, interval: float = 1.0) -> None:
        super().__init__(name="bench-autoanalyze", daemon=True)
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.interval = interval
        self.statements = 1
        try:
            self.off = self.conn.execute("SHOW autovacuum").fetchone()[0] == "off"
        except BaseException:  # never started, so stop() never closes it: close it here
            self.conn.close()
            raise
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
        for schema, table, vacuum in self.conn.execute(_DUE).fetchall():
            self.statements += 1
            # VACUUM (ANALYZE) analyzes even when only the vacuum was due: autovacuum would
            # analyze it soon after, and one statement is enough. Schema named: DBOS's tables
            # are in `dbos`.
            what = "VACUUM (ANALYZE)" if vacuum else "ANALYZE"
            self.conn.execute(f'{what} "{schema}"."{table}"')
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
    return f"autovacuum is off: the benchmark ran its VACUUM/ANALYZE rules every 1 s ({done})"
