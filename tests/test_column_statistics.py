"""ANALYZE leaves out the columns no statement filters, sorts or groups by (runs 0019,
toolcalls 0013: issue 12, PostgreSQL's CPU per call).

Autovacuum analyzes the event table each time a tenth of it has changed, and sorting the sample
of each column is most of the work; the payload and the two hashes were 37 % of it. The
columns kept are those a WHERE, ORDER BY or GROUP BY reads: they keep their statistics."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]

WITHOUT = {
    "runs_event": {"payload", "hash", "prev_hash", "recorded_at", "producer", "schema_version"},
    "toolcalls_toolcall": {"args", "args_digest", "result", "last_error_message"},
    "toolcalls_receipt": {"raw_response"},
}


def _targets(table: str) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, attstattarget FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            [table],
        )
        return dict(cursor.fetchall())


def test_only_the_unfiltered_columns_have_no_statistics_target() -> None:
    for table, columns in WITHOUT.items():
        targets = _targets(table)
        assert {c for c, t in targets.items() if t == 0} == columns, table
        # the rest keeps the server's default (-1), not a guess of ours
        assert {t for c, t in targets.items() if c not in columns} == {-1}, table


def test_analyze_leaves_out_a_column_whose_target_is_0() -> None:
    """What the migrations rely on, on a table of this test's own: ANALYZE of a shared table
    would also rewrite its row and page counts in place (not undone by the test's rollback),
    which changes the plans later tests see."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE probe (kept int, skipped jsonb)")
        cursor.execute("ALTER TABLE probe ALTER COLUMN skipped SET STATISTICS 0")
        cursor.execute(
            "INSERT INTO probe SELECT n, jsonb_build_object('n', n) FROM generate_series(1, 100) n"
        )
        cursor.execute("ANALYZE probe")
        cursor.execute("SELECT attname FROM pg_stats WHERE tablename = 'probe'")
        analyzed = {name for (name,) in cursor.fetchall()}
    assert analyzed == {"kept"}
