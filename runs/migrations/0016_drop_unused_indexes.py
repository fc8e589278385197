"""Drop indexes that no statement uses (issue 12 point 4: PostgreSQL's CPU per call).

Every event INSERT, and every outbox INSERT and non-HOT UPDATE (a lease, a `done_at`), writes an
entry in each index of its table. Two of them serve no query:
- `event_entered_unknown`: the dwell of the unknowns reads `toolcalls_toolcall.status_since`
  from `toolcall_desk` now (console/metrics.py), not the events;
- the `varchar_pattern_ops` index PostgreSQL's backend adds beside a text primary key (for
  LIKE 'prefix%'), on runs_event and runs_outboxmessage: ids are only ever compared whole, which
  the primary key serves. Django has no model option for it, hence the SQL, on PostgreSQL only.
"""

from __future__ import annotations

from django.db import migrations

# (index, table, column): the names Django's PostgreSQL schema editor gave them (a hash of the
# table and column names, the same in every database).
LIKE_INDEXES = [
    ("runs_event_id_587f5bee_like", "runs_event", "id"),
    ("runs_outboxmessage_id_ad8b5f74_like", "runs_outboxmessage", "id"),
]


def drop_like_indexes(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _, _ in LIKE_INDEXES:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def create_like_indexes(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table, column in LIKE_INDEXES:
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}" varchar_pattern_ops)'
        )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0015_admin_event_append_only"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="event", name="event_entered_unknown"),
        migrations.RunPython(drop_like_indexes, create_like_indexes),
    ]
