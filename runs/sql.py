"""The runs app's hand-written SQL: the statements of the hottest write, appending events.

Compiling the equivalent ORM queries cost several times more CPU than running them
(bench_dispatch), so they are written out here, once. tests/test_runs_sql.py proves that they
write exactly what the ORM writes (same rows, same hashes).
"""

from __future__ import annotations

import re
from typing import Any

from django.db import DatabaseError, connection

from runs.models import ApiKey, Event, Run, Tenant, User

EVENT_FIELDS = Event._meta.concrete_fields
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


# A batch's runs (those from the one it first writes about on, in the database's order of
# ids: the order every batch locks its runs in, so two batches wait instead of deadlocking)
# in one statement, then their last events in one more (each an index probe of (run, seq)).
_LOCK_RUNS = "SELECT id FROM runs_run WHERE id = ANY(%s) AND id >= %s ORDER BY id FOR UPDATE"
_HEADS = (
    "SELECT r.id, e.id, e.seq, e.hash, e.tool_call_id FROM unnest(%s::varchar[]) AS r(id)"
    " LEFT JOIN LATERAL (SELECT id, seq, hash, tool_call_id FROM runs_event"
    " WHERE run_id = r.id ORDER BY seq DESC LIMIT 1) e ON true"
)


def lock_and_read_heads(run_ids: list[str], first: str) -> dict[str, dict[str, Any] | None]:
    """`lock_and_read_head` of the runs of `run_ids` from `first` on (PostgreSQL only): run id
    -> its last event (None when it has none yet), for the runs that exist. Two statements
    for any number of runs, for the same reason as there: the read must not share the lock's
    snapshot."""
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_RUNS, [list(run_ids), first])
        locked = [row[0] for row in cursor.fetchall()]
        if not locked:
            return {}
        cursor.execute(_HEADS, [locked])
        rows = cursor.fetchall()
    fields = ("id", "seq", "hash", "tool_call_id")
    return {
        row[0]: None if row[1] is None else dict(zip(fields, row[1:], strict=True)) for row in rows
    }


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
    rows = [
        [
            field.get_db_prep_save(getattr(event, field.attname), connection)
            for field in EVENT_FIELDS
        ]
        for event in events
    ]
    _insert(Event, rows)
    for event in events:
        event._state.adding, event._state.db = False, connection.alias


# psycopg keeps the parsed form of a statement of at most this many parameters (psycopg's
# _queries.MAX_CACHED_STATEMENT_PARAMS); it parses a longer one again each time.
_CACHED_PARAMS = 50


def _insert(model: Any, rows: list[list[Any]]) -> None:
    """INSERT the rows (values prepared for the database, in the order of the model's concrete
    fields) in one statement. Many rows on PostgreSQL: one array per column, unnested, so the
    statement's text is the same for any number of rows — a VALUES list of rows times
    columns placeholders is past psycopg's cache and was parsed again for each batch (8 % of
    a batch's CPU in profile_dispatch --profile). A few rows (a proposal's two events, a
    single call's record): VALUES, cached, which costs less than dumping arrays."""
    fields = model._meta.concrete_fields
    if connection.vendor == "postgresql" and len(rows) * len(fields) > _CACHED_PARAMS:
        columns = [list(column) for column in zip(*rows, strict=True)]
        statement = _unnest_insert(model)
    else:
        columns = [value for row in rows for value in row]
        statement = _values_insert(model, len(rows))
    with connection.cursor() as cursor:
        cursor.execute(statement, columns)


def _insert_into(model: Any) -> str:
    names = ", ".join(connection.ops.quote_name(f.column) for f in model._meta.concrete_fields)
    return f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({names})"


# Made once per model and number of rows: quoting every column each time was a tenth of the
# INSERT's own CPU (profile_propose, sampled).
_VALUES: dict[tuple[Any, int], str] = {}


def _values_insert(model: Any, count: int) -> str:
    statement = _VALUES.get((model, count))
    if statement is None:
        row = f"({', '.join(['%s'] * len(model._meta.concrete_fields))})"
        statement = f"{_insert_into(model)} VALUES {', '.join([row] * count)}"
        _VALUES[(model, count)] = statement
    return statement


_UNNEST: dict[Any, str] = {}


def _unnest_insert(model: Any) -> str:
    statement = _UNNEST.get(model)
    if statement is None:
        # varchar(40)[] is varchar[]: the column's own type checks the length on insert.
        types = [re.sub(r"\(.*\)", "", f.db_type(connection)) for f in model._meta.concrete_fields]
        arrays = ", ".join(f"%s::{kind}[]" for kind in types)
        statement = _UNNEST[model] = f"{_insert_into(model)} SELECT * FROM unnest({arrays})"
    return statement


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


# The run page's timeline: its latest events, newest first, on the (run, seq) index. The
# ORM's compilation of this read was as much CPU as the rest of the timeline's reading.
_TIMELINE_COLUMNS = (
    "id, seq, event_type, occurred_at, actor, producer, tool_call_id, causation_id, payload"
)
_TIMELINE = (
    f"SELECT {_TIMELINE_COLUMNS} FROM {Event._meta.db_table}"
    " WHERE run_id = %s {before} ORDER BY seq DESC LIMIT %s"
)
_TIMELINE_LATEST = _TIMELINE.format(before="")
_TIMELINE_BEFORE = _TIMELINE.format(before="AND seq < %s")


def timeline_window(run_id: str, size: int, before: int | None) -> list[tuple]:
    """The columns of selectors.TimelineEvent of the run's latest `size` events before
    sequence number `before` (all: None), newest first, as the ORM's values_list reads them
    (the payload decoded)."""
    with connection.cursor() as cursor:
        if before is None:
            cursor.execute(_TIMELINE_LATEST, [run_id, size])
        else:
            cursor.execute(_TIMELINE_BEFORE, [run_id, before, size])
        rows = cursor.fetchall()
    payload = Event._meta.get_field("payload")
    return [(*row[:-1], payload.from_db_value(row[-1], None, connection)) for row in rows]


# --- rows of other models written in one statement ------------------------------------------


def insert_rows(objs: list[Any]) -> None:
    """INSERT new rows of one model in one statement, as `obj.save(force_insert=True)` writes
    each (auto_now dates set, values prepared by their fields), without compiling it. For
    models without save signals or overridden `save()` (outbox messages, receipts)."""
    if not objs:
        return
    model = type(objs[0])
    fields = model._meta.concrete_fields
    rows = [
        [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]
        for obj in objs
    ]
    _insert(model, rows)
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias


# --- a transition's save --------------------------------------------------------------------
# Every transition saves its row's changed columns (runs/transitions.py): compiled by the ORM,
# that UPDATE was the largest cost of a dispatch batch after the events (profile_dispatch
# --profile: 300 saves per 100 calls, ~4 ms each under the profiler). Written out here;
# tests/test_runs_sql.py proves the row is the one `save(update_fields=…)` leaves.


def update_fields(obj: Any, names: list[str]) -> None:
    """What `obj.save(update_fields=names)` writes (auto_now columns among them set now), in a
    statement made without the ORM's compiler. For models without save signals or an
    overridden `save()` beyond runs.changes (tool calls, approvals)."""
    meta = obj._meta
    fields = [meta.get_field(name) for name in names]
    assignments = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)
    values = [f.get_db_prep_save(f.pre_save(obj, False), connection) for f in fields]
    statement = (
        f"UPDATE {connection.ops.quote_name(meta.db_table)} SET {assignments}"
        f" WHERE {connection.ops.quote_name(meta.pk.column)} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [*values, meta.pk.get_db_prep_value(obj.pk, connection)])
        if cursor.rowcount != 1:
            # As Model.save(update_fields=…) says it: the row is gone (never for a locked one).
            raise DatabaseError("Save with update_fields did not affect any rows.")
    obj._remember(fields)


def update_many(objs: list[Any], names: list[str]) -> None:
    """`update_fields(obj, names)` of many rows of one model in one statement, PostgreSQL's
    (elsewhere one by one): the new values in one array per column, joined on the key."""
    if connection.vendor != "postgresql" or len(objs) == 1:
        for obj in objs:
            update_fields(obj, names)
        return
    meta = objs[0]._meta
    fields = [meta.get_field(name) for name in names]
    columns = [
        [f.get_db_prep_save(f.pre_save(obj, False), connection) for obj in objs] for f in fields
    ]
    keys = [meta.pk.get_db_prep_value(obj.pk, connection) for obj in objs]
    with connection.cursor() as cursor:
        cursor.execute(_update_many(meta, fields), [keys, *columns])
        if cursor.rowcount != len(objs):
            raise DatabaseError("Save with update_fields did not affect every row.")
    for obj in objs:
        obj._remember(fields)


def _update_many(meta: Any, fields: list[Any]) -> str:
    quote = connection.ops.quote_name
    # varchar(40)[] is varchar[]: the column's own type checks the length (as _unnest_insert).
    arrays = [meta.pk, *fields]
    types = [re.sub(r"\(.*\)", "", f.db_type(connection)) for f in arrays]
    names = [f"v{i}" for i in range(len(arrays))]
    assignments = ", ".join(f"{quote(f.column)} = v.v{i + 1}" for i, f in enumerate(fields))
    unnest = ", ".join(f"%s::{kind}[]" for kind in types)
    return (
        f"UPDATE {quote(meta.db_table)} AS t SET {assignments}"
        f" FROM unnest({unnest}) AS v({', '.join(names)}) WHERE t.{quote(meta.pk.column)} = v.v0"
    )


# The signed-in person with their tenant, on every console request (runs/backends.py): the
# ORM's select_related of the two wide rows was a tenth of the approve POST's CPU
# (bench_approve --profile). tests/test_runs_sql_person.py proves the objects equal the ORM's.
_PERSON = (
    f"SELECT {_columns(User, 'u')}, {_columns(Tenant, 't')} FROM {User._meta.db_table} u"
    f" LEFT JOIN {Tenant._meta.db_table} t ON t.id = u.tenant_id WHERE u.id = %s"
)


def person_read(user_id: Any) -> User | None:
    """The person with their tenant loaded (none for a person without one), as
    `User.objects.select_related("tenant")` gives them; None when there is none."""
    if connection.vendor != "postgresql":
        return User.objects.select_related("tenant").filter(pk=user_id).first()
    with connection.cursor() as cursor:
        cursor.execute(_PERSON, [User._meta.pk.to_python(user_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    first = len(User._meta.concrete_fields)
    person = _make(User, row[:first])
    tenant = None if person.tenant_id is None else _make(Tenant, row[first:])
    User.tenant.field.set_cached_value(person, tenant)
    return person
