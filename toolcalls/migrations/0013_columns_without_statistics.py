"""ANALYZE skips the tool call's and the receipt's columns no statement filters, sorts or
groups by (issue 12 point 4; the events' are in runs 0019, which says why).

At 2,000 calls, ANALYZE of `toolcalls_toolcall` took 54 ms of backend CPU with the JSON
arguments and result, the arguments' digest and the error message, 33 ms without. The receipt's
`raw_response` is the external system's whole answer, kept for the audit and never searched.
PostgreSQL only: SQLite has no per-column statistics target.
"""

from __future__ import annotations

from django.db import migrations

COLUMNS = {
    "toolcalls_toolcall": ("args", "args_digest", "result", "last_error_message"),
    "toolcalls_receipt": ("raw_response",),
}


def _set_statistics(target: int):
    def apply(apps: object, schema_editor: object) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for table, columns in COLUMNS.items():
            alter = ", ".join(f'ALTER COLUMN "{c}" SET STATISTICS {target}' for c in columns)
            schema_editor.execute(f'ALTER TABLE "{table}" {alter}')

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("toolcalls", "0012_partial_indexes_on_null_columns"),
    ]

    # -1: back to the server's default_statistics_target.
    operations = [migrations.RunPython(_set_statistics(0), _set_statistics(-1))]
