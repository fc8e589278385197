"""Index mostly-NULL columns where set only; drop toolcalls_receipt's LIKE twins (issue 12).

A call's status changes are never HOT (`execution_status` is indexed), so each of its about three
writes per dispatch (insert, claim, record) puts an entry in every index of toolcalls_toolcall.
`decision`, `desk_owner` and `compensation_of` are NULL in nearly every row, and a btree holds an
entry for each NULL: partial indexes (`WHERE … IS NOT NULL`) hold only the rows that have one.
`x = value` implies `x IS NOT NULL` (= is strict), so every look-up by value, the foreign keys'
checks and prepared statements' generic plans included, still reads them. The unique index of
`compensation_of` becomes a partial unique constraint: NULLs never collided, so at most one
compensation per call is enforced as before (commands.tool_call_compensate's IntegrityError).

On toolcalls_receipt (one insert per dispatched call) the `varchar_pattern_ops` twins PostgreSQL's
backend adds beside `id`, `attempt_id` and `tool_call_id` serve only LIKE 'prefix%', which no
statement runs on receipts; their btree indexes serve `=`. The SQL runs on PostgreSQL only.
"""

from __future__ import annotations

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# (index, table, column): the names Django's PostgreSQL schema editor gave them (a hash of the
# table and column names, the same in every database).
LIKE_INDEXES = [
    ("toolcalls_receipt_id_5bf8e279_like", "toolcalls_receipt", "id"),
    ("toolcalls_receipt_attempt_id_54446161_like", "toolcalls_receipt", "attempt_id"),
    ("toolcalls_receipt_tool_call_id_0c194f80_like", "toolcalls_receipt", "tool_call_id"),
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
        ("runs", "0017_event_tenant_no_db_fk"),
        ("toolcalls", "0011_drop_unused_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="toolcall",
            name="compensation_of",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="compensations",
                to="toolcalls.toolcall",
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="decision",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                to="runs.decision",
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="desk_owner",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(
                condition=models.Q(("decision__isnull", False)),
                fields=["decision"],
                name="toolcall_decision",
            ),
        ),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(
                condition=models.Q(("desk_owner__isnull", False)),
                fields=["desk_owner"],
                name="toolcall_desk_owner",
            ),
        ),
        migrations.AddConstraint(
            model_name="toolcall",
            constraint=models.UniqueConstraint(
                condition=models.Q(("compensation_of__isnull", False)),
                fields=("compensation_of",),
                name="toolcall_one_compensation",
            ),
        ),
        migrations.RunPython(drop_like_indexes, create_like_indexes),
    ]
