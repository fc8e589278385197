"""Checkpoint versions and feedback facts are written once: PostgreSQL refuses UPDATE of
their rows, so an id (`ckpt_…`, `fb_…`) always names the content it was given.

DELETE stays allowed (a test flush; moving finished runs out of the hot tables). The
embedded SQLite default is a single-user demo database and gets no trigger.
"""

from __future__ import annotations

from django.db import migrations

TABLES = ("memory_checkpoint", "memory_feedback")

# `%%` is a literal `%` once Django formats the statement.
FUNCTION = """
CREATE OR REPLACE FUNCTION memory_write_once() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '%% is written once: UPDATE refused', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""


def create(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION)
    for table in TABLES:
        schema_editor.execute(
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION memory_write_once()"
        )


def drop(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_update ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS memory_write_once()")


class Migration(migrations.Migration):
    dependencies = [("memory", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
