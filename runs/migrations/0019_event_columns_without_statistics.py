"""ANALYZE skips the event columns no statement filters, sorts or groups by (issue 12 point 4).

PostgreSQL's ANALYZE samples up to 30,000 rows and, for each column, sorts the sample to find
its common values and histogram. On `runs_event` the JSON payload and the two 64-character
hashes were most of that work: at 14,000 rows, 373 ms of backend CPU per ANALYZE with them and
234 ms without (payload, hash, prev_hash; measured with /proc on the benchmark's database), and
autovacuum analyzes the table each time a tenth of it has changed. No query reads statistics of
these columns: the chain is read by `(run, seq)`, `hash` is only unique, and the payload is
searched through expressions (`payload -> 'external_id'`), which have no column statistics.
`recorded_at`, `producer` and `schema_version` are never in a WHERE, ORDER BY or GROUP BY either.
A statistics target of 0 leaves a column out of ANALYZE (the planner then uses its defaults
for it, as it would for an expression); everything else keeps the server's default target.
PostgreSQL only: SQLite has no per-column statistics target.
"""

from __future__ import annotations

from django.db import migrations

TABLE = "runs_event"
COLUMNS = ("payload", "hash", "prev_hash", "recorded_at", "producer", "schema_version")


def _set_statistics(target: int):
    def apply(apps: object, schema_editor: object) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        columns = ", ".join(f'ALTER COLUMN "{c}" SET STATISTICS {target}' for c in COLUMNS)
        schema_editor.execute(f'ALTER TABLE "{TABLE}" {columns}')

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0018_event_partial_id_indexes"),
    ]

    # -1: back to the server's default_statistics_target.
    operations = [migrations.RunPython(_set_statistics(0), _set_statistics(-1))]
