"""ANALYZE leaves out the columns no statement filters, sorts or groups by (runs 0019,
toolcalls 0013: issue 12, PostgreSQL's CPU per call).

Autovacuum analyzes the event table each time a tenth of it has changed, and sorting the sample
of each column is most of the work; the payload and the two hashes were 37 % of it. The
columns kept are those a WHERE, ORDER BY or GROUP BY reads: they keep their statistics."""

from __future__ import annotations

import pytest
from django.db import connection

from runs import services as run_services
from runs.models import Tenant

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]

WITHOUT = {
    "runs_event": {"payload", "hash", "prev_hash", "recorded_at", "producer", "schema_version"},
    "toolcalls_toolcall": {"args", "args_digest", "result", "last_error_message"},
    "toolcalls_receipt": {"raw_response"},
}
# Columns the pages and the dispatch filter or sort by: their statistics must stay.
KEPT = {"runs_event": {"run_id", "seq", "event_type", "tenant_id", "occurred_at", "actor"}}


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


def test_analyze_skips_them_and_keeps_the_rest(tenant: Tenant) -> None:
    for n in range(3):
        run_services.run_start(tenant=tenant, title=f"refund {n}", actor="test")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_event")
        cursor.execute("SELECT attname FROM pg_stats WHERE tablename = 'runs_event'")
        analyzed = {name for (name,) in cursor.fetchall()}
    assert not analyzed & WITHOUT["runs_event"]
    assert KEPT["runs_event"] <= analyzed
