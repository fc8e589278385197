"""Drop indexes that no statement uses (issue 12 point 4: PostgreSQL's CPU per call).

A call's status changes are non-HOT updates (`execution_status` is indexed), so each writes an
entry in every index of toolcalls_toolcall: 18 indexes, 5 writes per call. Seven serve no query:
- the foreign-key indexes of `tenant` and `run`: toolcall_obj, toolcall_figures and
  toolcall_desk begin with `tenant_id`, and (run, execution_status) with `run_id`;
- the `varchar_pattern_ops` indexes PostgreSQL's backend adds beside each indexed text column
  (for LIKE 'prefix%'): ids and foreign keys are only ever compared whole, which their btree
  index or unique constraint serves (the planner picked the LIKE twin for `=` at random).
On toolcalls_attempt the same: `tool_call`'s index (attempt_unique_number begins with it) and
the LIKE twins of `id` and `run_id`. The SQL runs on PostgreSQL only: Django has no model
option for the LIKE twins.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): the names Django's PostgreSQL schema editor gave them (a hash of the
# table and column names, the same in every database). The LIKE twins of `run` (toolcall) and
# `tool_call` (attempt) go with their AlterField below.
LIKE_INDEXES = [
    ("toolcalls_toolcall_id_a45b1f8f_like", "toolcalls_toolcall", "id"),
    (
        "toolcalls_toolcall_compensation_of_id_5fa509bd_like",
        "toolcalls_toolcall",
        "compensation_of_id",
    ),
    ("toolcalls_toolcall_decision_id_ab6e126e_like", "toolcalls_toolcall", "decision_id"),
    (
        "toolcalls_toolcall_external_request_id_2ebff57a_like",
        "toolcalls_toolcall",
        "external_request_id",
    ),
    ("toolcalls_attempt_id_760c3ef8_like", "toolcalls_attempt", "id"),
    ("toolcalls_attempt_run_id_272b1edd_like", "toolcalls_attempt", "run_id"),
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
        ("runs", "0016_drop_unused_indexes"),
        ("toolcalls", "0010_chat_channels_hear_still_unknown"),
    ]

    operations = [
        migrations.AlterField(
            model_name="attempt",
            name="tool_call",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="attempts",
                to="toolcalls.toolcall",
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="tool_calls",
                to="runs.run",
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="tool_calls",
                to="runs.tenant",
            ),
        ),
        migrations.RunPython(drop_like_indexes, create_like_indexes),
    ]
