"""Make runs_adminevent append-only at the database, as runs_event is (0002).

Its hash chain (0012) finds an edited or removed row in the middle, but not the newest row
deleted; the trigger refuses both. The one function now names the table it guards, so both
tables share it; the same `countersign.allow_event_rewrite = 'on'` lets the test flush and
maintenance through. PostgreSQL only, like 0002.
"""

from __future__ import annotations

from django.db import migrations

# `%%` is a literal `%` once Django formats the statement.
FUNCTION = """
CREATE OR REPLACE FUNCTION runs_event_append_only() RETURNS trigger AS $$
BEGIN
    IF current_setting('countersign.allow_event_rewrite', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '%% is append-only: %% refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""

TRIGGERS = """
CREATE TRIGGER runs_adminevent_no_update_delete
    BEFORE UPDATE OR DELETE ON runs_adminevent
    FOR EACH ROW EXECUTE FUNCTION runs_event_append_only();

CREATE TRIGGER runs_adminevent_no_truncate
    BEFORE TRUNCATE ON runs_adminevent
    FOR EACH STATEMENT EXECUTE FUNCTION runs_event_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS runs_adminevent_no_truncate ON runs_adminevent;
DROP TRIGGER IF EXISTS runs_adminevent_no_update_delete ON runs_adminevent;
"""


def create(apps: object, schema_editor: object) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)
        schema_editor.execute(TRIGGERS)


def drop(apps: object, schema_editor: object) -> None:
    # The function keeps its table-naming message: runs_event's trigger still uses it.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("runs", "0014_event_person_index")]

    operations = [migrations.RunPython(create, drop)]
