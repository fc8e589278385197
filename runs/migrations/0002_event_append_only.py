"""Make runs_event append-only at the database.

UPDATE, DELETE and TRUNCATE raise unless the transaction set
`countersign.allow_event_rewrite = 'on'` (only the test flush and maintenance do). PostgreSQL
only: the embedded SQLite default is a single-user demo database.
"""

from __future__ import annotations

from django.db import migrations

# `%%` is a literal `%` once Django formats the statement.
CREATE = """
CREATE OR REPLACE FUNCTION runs_event_append_only() RETURNS trigger AS $$
BEGIN
    IF current_setting('countersign.allow_event_rewrite', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'runs_event is append-only: %% refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER runs_event_no_update_delete
    BEFORE UPDATE OR DELETE ON runs_event
    FOR EACH ROW EXECUTE FUNCTION runs_event_append_only();

CREATE TRIGGER runs_event_no_truncate
    BEFORE TRUNCATE ON runs_event
    FOR EACH STATEMENT EXECUTE FUNCTION runs_event_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS runs_event_no_truncate ON runs_event;
DROP TRIGGER IF EXISTS runs_event_no_update_delete ON runs_event;
DROP FUNCTION IF EXISTS runs_event_append_only();
"""


def create(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
