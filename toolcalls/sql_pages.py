"""The toolcalls app's written-out reads for the console's pages (the dispatch path's are in
toolcalls/sql.py): other calls on one object. tests/test_calls_on_object_sql.py proves the
rows equal the ORM's (selectors.calls_on_object_orm)."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from runs import dbvalues
from toolcalls.models import ToolCall

_COLUMNS = ", ".join(f'c."{field.column}"' for field in ToolCall._meta.concrete_fields)


# --- other calls on one object (selectors.calls_on_object) ----------------------------------
# What the approval page warns with and the proposal's context reads: the tenant's open calls
# on the object, or those changed since a moment, newest first, from the toolcall_obj index
# read backwards. Compiling the ORM's query was a fifth of the approval page's CPU
# (bench_pages --profile "approval page").
_ON_OBJECT = (
    f"SELECT {_COLUMNS} FROM {ToolCall._meta.db_table} c"
    " WHERE c.tenant_id = %s AND c.object_ref = %s"
    " AND (NOT (c.execution_status IN ({final})) OR c.updated_at >= %s){capability}{exclude}"
    " ORDER BY c.created_at DESC, c.id DESC LIMIT %s"
)


def calls_on_object(
    tenant_id: int,
    object_ref: str,
    since: Any,
    capability_id: str | None,
    exclude: str | None,
    limit: int,
) -> list[ToolCall]:
    """The rows of selectors.calls_on_object_orm, as instances of whole rows."""
    final = ToolCall.FINAL_EXECUTION
    statement = _ON_OBJECT.format(
        final=", ".join(["%s"] * len(final)),
        capability=" AND c.capability_id = %s" if capability_id else "",
        exclude=" AND c.id <> %s" if exclude else "",
    )
    params = [tenant_id, object_ref, *final, since]
    params += [value for value in (capability_id, exclude) if value]
    with connection.cursor() as cursor:
        cursor.execute(statement, [*params, limit])
        rows = cursor.fetchall()
    conn = connections[DEFAULT_DB_ALIAS]
    return [dbvalues.from_row(ToolCall, conn, row) for row in rows]
