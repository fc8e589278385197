"""The runs app's hand-written SQL: the statements of the hottest write, appending events.

Compiling the equivalent ORM queries cost several times more CPU than running them
(bench_dispatch), so they are written out here, once. tests/test_runs_sql.py proves that they
write exactly what the ORM writes (same rows, same hashes).
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from runs.models import ApiKey, Event, Run, Tenant, User

EVENT_FIELDS = Event._meta.concrete_fields
_COLUMNS = ", ".join(field.column for field in EVENT_FIELDS)
_ROW = f"({', '.join(['%s'] * len(EVENT_FIELDS))})"
# The run's last event, and the id of the tool call's last event, in one statement (none
# when the run has no event yet).
_READ = (
    "SELECT id, seq, hash, tool_call_id, (SELECT c.id FROM runs_event c"
    " WHERE c.tool_call_id = %s ORDER BY c.seq DESC LIMIT 1)"
    " FROM runs_event WHERE run_id = %s ORDER BY seq DESC LIMIT 1"
)
_LAST_OF_CALL = "SELECT id FROM runs_event WHERE tool_call_id = %s ORDER BY seq DESC LIMIT 1"


def lock_and_read_head(run_id: str, tool_call_id: str) -> tuple[dict[str, Any] | None, str]:
    """(the run's last event, the id of the tool call's last event), the run row locked.

    The lock orders concurrent appends; the (run, seq) unique constraint is the backstop if
    anything ever appends without it. It is its own statement: a read in the same statement
    would see the snapshot from before the lock was granted, missing the event that the
    previous holder just committed. SQLite has no row locks: the database lock serializes
    its writers already."""
    with connection.cursor() as cursor:
        if connection.features.has_select_for_update:
            cursor.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [run_id])
            if cursor.fetchone() is None:
                raise Run.DoesNotExist(run_id)
        # NULL matches no row: run-level events have no previous event of a call.
        cursor.execute(_READ, [tool_call_id or None, run_id])
        row = cursor.fetchone()
    if row is None:
        return None, ""
    return dict(zip(("id", "seq", "hash", "tool_call_id"), row[:4], strict=True)), row[4] or ""


def last_event_of_call(tool_call_id: str) -> str:
    """The id of the tool call's last stored event ('' when none), for a run already locked."""
    with connection.cursor() as cursor:
        cursor.execute(_LAST_OF_CALL, [tool_call_id])
        row = cursor.fetchone()
    return row[0] if row else ""


_LAST_OF_CALLS = (
    "SELECT DISTINCT ON (tool_call_id) tool_call_id, id FROM runs_event"
    " WHERE tool_call_id = ANY(%s) ORDER BY tool_call_id, seq DESC"
)


def last_events_of_calls(tool_call_ids: list[str]) -> dict[str, str]:
    """`last_event_of_call` of many calls in one statement (a call with none is left out)."""
    with connection.cursor() as cursor:
        cursor.execute(_LAST_OF_CALLS, [list(tool_call_ids)])
        return dict(cursor.fetchall())


def insert_events(events: list[Event]) -> None:
    """All of them in one INSERT."""
    if not events:
        return
    values: list[Any] = []
    for event in events:
        values.extend(
            field.get_db_prep_save(getattr(event, field.attname), connection)
            for field in EVENT_FIELDS
        )
    statement = f"INSERT INTO runs_event ({_COLUMNS}) VALUES {', '.join([_ROW] * len(events))}"
    with connection.cursor() as cursor:
        cursor.execute(statement, values)
    for event in events:
        event._state.adding, event._state.db = False, connection.alias


# --- the agent API's key --------------------------------------------------------------------
# Every API request reads its key with the key's tenant and person: the ORM's compiling of that
# three-table select_related was a tenth of a proposal's API request (profile_propose --via
# api). Written out here; tests/test_runs_sql.py proves the objects equal the ORM's.


def _columns(model: Any, alias: str) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def _make(model: Any, values: tuple) -> Any:
    fields = model._meta.concrete_fields
    converted = [
        value
        if value is None or not hasattr(field, "from_db_value")
        else field.from_db_value(value, None, connection)
        for field, value in zip(fields, values, strict=True)
    ]
    return model.from_db(connection.alias, [field.attname for field in fields], converted)


_API_KEY = (
    f"SELECT {_columns(ApiKey, 'k')}, {_columns(Tenant, 't')}, {_columns(User, 'u')}"
    f" FROM {ApiKey._meta.db_table} k JOIN {Tenant._meta.db_table} t ON t.id = k.tenant_id"
    f" LEFT JOIN {User._meta.db_table} u ON u.id = k.principal_id WHERE k.id = %s"
)


def api_key_read(key_id: str) -> ApiKey | None:
    """The key with its tenant and principal loaded, as
    `ApiKey.objects.select_related("tenant", "principal")` gives it; None when there is none."""
    if connection.vendor != "postgresql":
        return ApiKey.objects.select_related("tenant", "principal").filter(pk=key_id).first()
    with connection.cursor() as cursor:
        cursor.execute(_API_KEY, [key_id])
        row = cursor.fetchone()
    if row is None:
        return None
    first = len(ApiKey._meta.concrete_fields)
    second = first + len(Tenant._meta.concrete_fields)
    key = _make(ApiKey, row[:first])
    tenant = _make(Tenant, row[first:second])
    principal = None if key.principal_id is None else _make(User, row[second:])
    # As select_related leaves them: the related objects cached on the key.
    ApiKey.tenant.field.set_cached_value(key, tenant)
    ApiKey.principal.field.set_cached_value(key, principal)
    return key


# --- rows of other models written in one statement ------------------------------------------


def insert_rows(objs: list[Any]) -> None:
    """INSERT new rows of one model in one statement, as `obj.save(force_insert=True)` writes
    each (auto_now dates set, values prepared by their fields), without compiling it. For
    models without save signals or overridden `save()` (outbox messages, receipts)."""
    if not objs:
        return
    fields = type(objs[0])._meta.concrete_fields
    values: list[Any] = []
    for obj in objs:
        values.extend(
            field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields
        )
    table = connection.ops.quote_name(type(objs[0])._meta.db_table)
    row = f"({', '.join(['%s'] * len(fields))})"
    statement = (
        f"INSERT INTO {table} ({', '.join(connection.ops.quote_name(f.column) for f in fields)})"
        f" VALUES {', '.join([row] * len(objs))}"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, values)
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias
