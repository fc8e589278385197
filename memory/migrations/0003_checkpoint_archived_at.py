"""A checkpoint version gets `archived_at` when its run ends. PostgreSQL still refuses every
other UPDATE of memory_checkpoint: the trigger lets a row change only from not archived to
archived, every other column as it was (and never back)."""

from __future__ import annotations

from django.db import migrations, models

FUNCTION = """
CREATE OR REPLACE FUNCTION memory_checkpoint_archive_only() RETURNS trigger AS $$
BEGIN
    IF OLD.archived_at IS NULL AND NEW.archived_at IS NOT NULL
        AND (to_jsonb(NEW) - 'archived_at') = (to_jsonb(OLD) - 'archived_at') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'memory_checkpoint is written once: only archiving may UPDATE it'
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""


def create(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION)
    schema_editor.execute("DROP TRIGGER IF EXISTS memory_checkpoint_no_update ON memory_checkpoint")
    schema_editor.execute(
        "CREATE TRIGGER memory_checkpoint_no_update BEFORE UPDATE ON memory_checkpoint "
        "FOR EACH ROW EXECUTE FUNCTION memory_checkpoint_archive_only()"
    )


def drop(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP TRIGGER IF EXISTS memory_checkpoint_no_update ON memory_checkpoint")
    schema_editor.execute(
        "CREATE TRIGGER memory_checkpoint_no_update BEFORE UPDATE ON memory_checkpoint "
        "FOR EACH ROW EXECUTE FUNCTION memory_write_once()"
    )
    schema_editor.execute("DROP FUNCTION IF EXISTS memory_checkpoint_archive_only()")


class Migration(migrations.Migration):
    dependencies = [("memory", "0002_write_once")]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="archived_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(create, drop),
    ]
