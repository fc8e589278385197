"""bench_dispatch's view of the server: pg_stat_statements read where the extension lives (the
benchmark's database, not `postgres`), and autovacuum's ANALYZE rule applied when the server's
autovacuum is off."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import psycopg
import pytest

from bench import analyze, pgreport, pgstats

URL = os.environ.get("DATABASE_URL", "")


@pytest.fixture
def database_url() -> Iterator[str]:
    """A scratch database of the tests' own name, made and dropped here."""
    if not URL.startswith("postgres"):
        pytest.fail("this test needs DATABASE_URL=postgres://…")
    name = f"{pgstats.database_name(URL)}_bench_stats"
    pgstats.recreate_database(URL, name)
    yield pgstats.with_database(URL, name)
    pgstats.drop_database(URL, name)


def test_it_counts_and_lists_the_statements_of_its_database(database_url: str) -> None:
    if pgstats.pg_stat_statements_state(database_url):
        pytest.skip("pg_stat_statements is not loaded on this server")
    assert pgstats.statements_reset(database_url)
    with psycopg.connect(pgstats.conninfo(database_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE probe (n int)")
        for n in range(3):
            conn.execute("INSERT INTO probe VALUES (%s)", [n])

    assert pgstats.statements_count(database_url) >= 4
    top = pgstats.top_statements(database_url)
    insert = next(s for s in top if s["query"].startswith("INSERT INTO probe"))
    assert (insert["calls"], insert["rows"]) == (3, 3)
    assert "INSERT INTO probe" in "\n".join(pgreport.statement_lines(database_url, calls=3))


def test_it_vacuums_and_analyzes_a_table_autovacuum_would(database_url: str) -> None:
    with psycopg.connect(pgstats.conninfo(database_url), autocommit=True) as conn:
        # Past autovacuum's default thresholds: 1000 rows inserted (VACUUM), 50 changed.
        conn.execute("CREATE TABLE probe AS SELECT generate_series(1, 1100) AS n")
        conn.execute("CREATE TABLE quiet (n int)")
        # DBOS keeps its tables in a schema of its own, which the statement must name.
        conn.execute("CREATE SCHEMA side")
        conn.execute("CREATE TABLE side.elsewhere AS SELECT generate_series(1, 1100) AS n")
    # The session's statistics reach the server when it ends; give them a moment.
    analyzer = analyze.AutoAnalyze(pgstats.conninfo(database_url))
    try:
        for _ in range(50):
            analyzer.analyze_due()
            if analyzer.analyzed:
                break
            time.sleep(0.1)
    finally:
        analyzer.stop()
    assert analyzer.analyzed == {"probe": 1, "elsewhere": 1}
    with psycopg.connect(pgstats.conninfo(database_url)) as conn:
        done = conn.execute(
            "SELECT last_vacuum IS NOT NULL, last_analyze IS NOT NULL FROM pg_stat_user_tables"
            " WHERE relname IN ('probe', 'elsewhere')"
        ).fetchall()
    assert done == [(True, True)] * 2


def test_it_says_who_analyzed() -> None:
    assert analyze.describe(None) == "the server's autovacuum analyzes the tables"
    assert analyze.describe({"b": 2, "a": 1}).endswith("every 1 s (a 1, b 2)")
