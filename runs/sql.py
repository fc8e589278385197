"""The runs app's hand-written SQL: the statements of the hottest write, appending events.

Compiling the equivalent ORM queries cost several times more CPU than running them
(bench_dispatch), so they are written out here, once. tests/test_runs_sql.py proves that they
write exactly what the ORM writes (same rows, same hashes).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections

from runs import dbvalues, pipeline
from runs.cursors import cursor_for
from runs.lookups import id_array
from runs.models import ApiKey, Event, Run, Session, Tenant, User

# The run's last event, and the id of the tool call's last event, in one statement (none
# when the run has no event yet); parameters: the call's id, the run's. approvals/sql.py's
# decision reads it as a branch of its own statement.
READ_HEAD = (
    "SELECT id, seq, hash, tool_call_id, (SELECT c.id FROM runs_event c"
    " WHERE c.tool_call_id = %s ORDER BY c.seq DESC LIMIT 1)"
    " FROM runs_event WHERE run_id = %s ORDER BY seq DESC LIMIT 1"
)
_LAST_OF_CALL = "SELECT id FROM runs_event WHERE tool_call_id = %s ORDER BY seq DESC LIMIT 1"
# The columns of a chain head as the events' batch keeps it (approvals/sql.py reads one too).
HEAD_FIELDS = ("id", "seq", "hash", "tool_call_id")


def lock_and_read_head(
    run_id: str, tool_call_id: str, *, held: bool = False
) -> tuple[dict[str, Any] | None, str]:
    """(the run's last event, the id of the tool call's last event), the run row locked.

    The lock orders concurrent appends; the (run, seq) unique constraint is the backstop if
    anything ever appends without it. It is its own statement: a read in the same statement
    would see the snapshot from before the lock was granted, missing the event that the
    previous holder just committed. `held`: an earlier statement of this transaction locked
    the run (FOR UPDATE) already, so the read alone, which starts after that lock was granted.
    SQLite has no row locks: the database lock serializes its writers already."""
    cursor = cursor_for(connections[DEFAULT_DB_ALIAS])
    if connection.features.has_select_for_update and not held:
        cursor.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [run_id])
        if cursor.fetchone() is None:
            raise Run.DoesNotExist(run_id)
    # NULL matches no row: run-level events have no previous event of a call.
    cursor.execute(READ_HEAD, [tool_call_id or None, run_id])
    row = cursor.fetchone()
    if row is None:
        return None, ""
    return dict(zip(HEAD_FIELDS, row[:4], strict=True)), row[4] or ""


# A batch's runs (those from the one it first writes about on, in the database's order of
# ids: the order every batch locks its runs in, so two batches wait instead of deadlocking)
# in one statement, then their last events in one more (each an index probe of (run, seq)).
_LOCK_RUNS = (
    "SELECT id FROM runs_run WHERE id = ANY(%s::varchar[]) AND id >= %s ORDER BY id FOR UPDATE"
)
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
    conn = connections[DEFAULT_DB_ALIAS]
    cursor = cursor_for(conn, _LOCK_RUNS)
    cursor.execute(_LOCK_RUNS, [id_array(run_ids), first])
    locked = [row[0] for row in cursor.fetchall()]
    if not locked:
        return {}
    cursor = cursor_for(conn, _HEADS)
    cursor.execute(_HEADS, [id_array(locked)])
    rows = cursor.fetchall()
    return {
        row[0]: None if row[1] is None else dict(zip(HEAD_FIELDS, row[1:], strict=True))
        for row in rows
    }


def last_event_of_call(tool_call_id: str) -> str:
    """The id of the tool call's last stored event ('' when none), for a run already locked."""
    cursor = cursor_for(connections[DEFAULT_DB_ALIAS], _LAST_OF_CALL)
    cursor.execute(_LAST_OF_CALL, [tool_call_id])
    row = cursor.fetchone()
    return row[0] if row else ""


_LAST_OF_CALLS = (
    "SELECT DISTINCT ON (tool_call_id) tool_call_id, id FROM runs_event"
    " WHERE tool_call_id = ANY(%s::varchar[]) ORDER BY tool_call_id, seq DESC"
)


def last_events_of_calls(tool_call_ids: list[str]) -> dict[str, str]:
    """`last_event_of_call` of many calls in one statement (a call with none is left out)."""
    cursor = cursor_for(connections[DEFAULT_DB_ALIAS], _LAST_OF_CALLS)
    cursor.execute(_LAST_OF_CALLS, [id_array(tool_call_ids)])
    return dict(cursor.fetchall())


# A task's first statement marks its outbox message done (runs/outbox.py mark_done): every
# task's, and the claim's of an approved call, on the approver's clock (bench_approve's
# hand-off). Compiling the ORM's UPDATE made it 583 Python function calls and about 1.0 ms of
# CPU, this 112 and 0.2 ms (cProfile and thread time of 200 in a test process).
# tests/test_outbox.py proves it writes what the ORM's update wrote.
_MARK_DONE = "UPDATE runs_outboxmessage SET done_at = %s WHERE id = %s AND done_at IS NULL"


def outbox_mark_done(outbox_id: str, at: datetime) -> None:
    """The message's `done_at` set to `at`, unless it is done already (inside
    `pipeline.writes_together()`, sent with the next statement)."""
    pipeline.write(connections[DEFAULT_DB_ALIAS], _MARK_DONE, [at, outbox_id])


def insert_events(events: list[Event]) -> None:
    """All of them in one INSERT."""
    if not events:
        return
    _insert(Event, events)
    _saved(events)


def events_insert(events: list[Event], conn: Any = None) -> tuple[str, str]:
    """(the INSERT of these events, its one parameter) on PostgreSQL, for a caller that sends
    it as the last part of its own statement, after a data-modifying WITH (toolcalls/
    sql_propose.py: the proposal's call and its events in one round trip). The rows are
    `insert_events`' (one JSON parameter, the same text for any number of events: psycopg and
    the server parse and plan it once); `events_saved(events)` once the statement ran.
    `conn`: the default database's connection, when the caller has it."""
    plan = dbvalues.plan(Event, conn or connections[DEFAULT_DB_ALIAS])
    return _json_insert(plan, plan.every), plan.json_rows(events, plan.every, True)


def events_saved(events: list[Event]) -> None:
    _saved(events)


# psycopg keeps the parsed form of a statement of at most this many parameters (psycopg's
# _queries.MAX_CACHED_STATEMENT_PARAMS); it parses a longer one again each time.
_CACHED_PARAMS = 50


def _insert(model: Any, objs: list[Any]) -> None:
    """INSERT the rows of these objects (values as `field.pre_save(obj, True)` gives them,
    prepared as their fields prepare them: runs/dbvalues.py) in one statement. Many rows on
    PostgreSQL: one JSON parameter unpacked by `json_to_recordset`, so the statement's text is
    the same for any number of rows and no value goes through psycopg's per-element array
    dumper (a VALUES list past psycopg's 50 cached parameters was parsed again for each batch;
    the arrays per column that replaced it cost, with the fields' preparing, 16 % of a
    worker's CPU in py-spy). A few rows (a proposal's two events, an outbox message): VALUES,
    cached — PostgreSQL's json_to_recordset costs ~0.1 ms more for one row (measured)."""
    conn = connections[DEFAULT_DB_ALIAS]
    plan = dbvalues.plan(model, conn)
    indexes = plan.every
    if plan.json_ok and len(objs) * len(indexes) > _CACHED_PARAMS:
        statement = _json_insert(plan, indexes)
        params = [plan.json_rows(objs, indexes, True)]
    else:
        params = [value for obj in objs for value in plan.params(obj, indexes, True)]
        statement = _values_insert(model, len(objs))
    pipeline.write(conn, statement, params)


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


_JSON_INSERT: dict[Any, str] = {}


def _json_insert(plan: dbvalues.Plan, indexes: list[int]) -> str:
    statement = _JSON_INSERT.get(plan.model)
    if statement is None:
        selects, source = plan.recordset(indexes, "x")
        statement = f"{_insert_into(plan.model)} SELECT {', '.join(selects)} FROM {source}"
        _JSON_INSERT[plan.model] = statement
    return statement


# --- the agent API's key --------------------------------------------------------------------
# Every API request reads its key with the key's tenant and person: the ORM's compiling of that
# three-table select_related was a tenth of a proposal's API request (profile_propose --via
# api). Written out here; tests/test_runs_sql.py proves the objects equal the ORM's.


def _columns(model: Any, alias: str) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def _make(model: Any, values: tuple) -> Any:
    return dbvalues.from_row(model, connections[DEFAULT_DB_ALIAS], values)


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
    _insert(type(objs[0]), objs)
    _saved(objs)


def _saved(objs: list[Any]) -> None:
    # As save() leaves them. Not `connection.alias`: the proxy finds the thread's connection
    # on each attribute read (asgiref's Local), and its alias is always this one.
    alias = DEFAULT_DB_ALIAS
    for obj in objs:
        obj._state.adding, obj._state.db = False, alias


# --- a transition's save --------------------------------------------------------------------
# Every transition saves its row's changed columns (runs/transitions.py): compiled by the ORM,
# that UPDATE was the largest cost of a dispatch batch after the events (profile_dispatch
# --profile: 300 saves per 100 calls, ~4 ms each under the profiler). Written out here;
# tests/test_runs_sql.py proves the row is the one `save(update_fields=…)` leaves.


def update_fields(obj: Any, names: list[str]) -> None:
    """What `obj.save(update_fields=names)` writes (auto_now columns among them set now), in a
    statement made without the ORM's compiler. For models without save signals or an
    overridden `save()` beyond runs.changes (tool calls, approvals)."""
    conn = connections[DEFAULT_DB_ALIAS]
    plan = dbvalues.plan(type(obj), conn)
    indexes = _indexes(plan, names)
    statement = _update_one(obj._meta, tuple(indexes), plan)
    key = obj._meta.pk.get_db_prep_value(obj.pk, conn)
    # The error as Model.save(update_fields=…) says it: the row is gone (never for a locked one).
    pipeline.write(
        conn,
        statement,
        [*plan.params(obj, indexes, False), key],
        rows=1,
        error="Save with update_fields did not affect any rows.",
    )
    obj._remember([plan.fields[i] for i in indexes])


def _indexes(plan: dbvalues.Plan, names: list[str]) -> list[int]:
    """The positions of the fields named (by name, as update_fields names them)."""
    positions = _POSITIONS.get(plan.model)
    if positions is None:
        # By name or attname, as Options.get_field finds them.
        positions = {f.attname: i for i, f in enumerate(plan.fields)}
        positions.update({f.name: i for i, f in enumerate(plan.fields)})
        _POSITIONS[plan.model] = positions
    return [positions[name] for name in names]


_POSITIONS: dict[Any, dict[str, int]] = {}
_UPDATES: dict[tuple[Any, tuple[int, ...]], str] = {}


def _update_one(meta: Any, indexes: tuple[int, ...], plan: dbvalues.Plan) -> str:
    statement = _UPDATES.get((meta.model, indexes))
    if statement is None:
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(plan.fields[i].column)} = %s" for i in indexes)
        statement = _UPDATES[(meta.model, indexes)] = (
            f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {quote(meta.pk.column)} = %s"
        )
    return statement


def update_many(objs: list[Any], names: list[str]) -> None:
    """`update_fields(obj, names)` of many rows of one model in one statement, PostgreSQL's
    (elsewhere one by one): the new values and the keys in one JSON parameter, as `_insert`."""
    conn = connections[DEFAULT_DB_ALIAS]
    plan = dbvalues.plan(type(objs[0]), conn) if objs else None
    if plan is None or not plan.json_ok or len(objs) == 1:
        for obj in objs:
            update_fields(obj, names)
        return
    meta = objs[0]._meta
    indexes = _indexes(plan, names)
    key = plan.fields.index(meta.pk)
    rows = plan.json_rows(objs, [key, *indexes], False)
    statement = _update_many(meta, plan, key, indexes)
    cursor = cursor_for(conn, statement)
    cursor.execute(statement, [rows])
    if cursor.rowcount != len(objs):
        raise DatabaseError("Save with update_fields did not affect every row.")
    fields = [plan.fields[i] for i in indexes]
    for obj in objs:
        obj._remember(fields)


_UPDATES_MANY: dict[tuple[Any, tuple[int, ...]], str] = {}


def _update_many(meta: Any, plan: dbvalues.Plan, key: int, indexes: list[int]) -> str:
    statement = _UPDATES_MANY.get((meta.model, tuple(indexes)))
    if statement is None:
        quote = connection.ops.quote_name
        selects, source = plan.recordset([key, *indexes], "v")
        assignments = ", ".join(
            f"{quote(plan.fields[i].column)} = {select}"
            for i, select in zip(indexes, selects[1:], strict=True)
        )
        statement = _UPDATES_MANY[(meta.model, tuple(indexes))] = (
            f"UPDATE {quote(meta.db_table)} AS t SET {assignments}"
            f" FROM {source} WHERE t.{quote(meta.pk.column)} = {selects[0]}"
        )
    return statement


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
    return None if row is None else _person_with_tenant(row)


def _person_with_tenant(values: tuple) -> User:
    """A person from their row's values followed by their tenant's, the tenant loaded."""
    first = len(User._meta.concrete_fields)
    person = _make(User, values[:first])
    tenant = None if person.tenant_id is None else _make(Tenant, values[first:])
    User.tenant.field.set_cached_value(person, tenant)
    return person


# The session with its person and their tenant, on every console request (runs/sessions.py,
# runs/backends.py): the two statements before (the session, then the person) were two of the
# approve click's round trips, each a wait for a core on a busy host (bench_approve --load
# dispatch). tests/test_sessions.py proves what it loads equal to the two reads'.
_SESSION = (
    "SELECT s.session_data, s.expire_date, s.user_id,"
    f" {_columns(User, 'u')}, {_columns(Tenant, 't')}"
    f" FROM {Session._meta.db_table} s LEFT JOIN {User._meta.db_table} u ON u.id = s.user_id"
    f" LEFT JOIN {Tenant._meta.db_table} t ON t.id = u.tenant_id"
    " WHERE s.session_key = %s AND s.expire_date > %s"
)


def session_read(session_key: str, now: datetime) -> tuple[Session, User | None] | None:
    """The live session of `session_key` and the person its row names, loaded as
    `person_read` loads them (None when the row names no one, or someone deleted since); None
    when the key is unknown or expired. PostgreSQL only (the caller reads plainly elsewhere)."""
    with connection.cursor() as cursor:
        cursor.execute(_SESSION, [session_key, now])
        row = cursor.fetchone()
    if row is None:
        return None
    session = Session(
        session_key=session_key, session_data=row[0], expire_date=row[1], user_id=row[2]
    )
    # No person's id (column 3) when the row names no one, or someone deleted since.
    return session, None if row[3] is None else _person_with_tenant(row[3:])


# --- the run page's run (runs/selectors.py run_for_page) -------------------------------------
# The run with its API key and the key's person, and its latest event's sequence number, as
# run_for_page's select_related and subquery read them: compiling that query was the largest
# single part of the run page's CPU, and all a poll of an unchanged run reads besides the
# person (bench_pages --profile "run page").
_PAGE_MODELS = (Run, ApiKey, User)


def _page_columns(model: Any, alias: str) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


_RUN_PAGE = (
    f"SELECT {_page_columns(Run, 'r')}, {_page_columns(ApiKey, 'k')}, {_page_columns(User, 'u')},"
    f' COALESCE((SELECT e.seq FROM "{Event._meta.db_table}" e WHERE e.run_id = r.id'
    " ORDER BY e.seq DESC LIMIT 1), 0)"
    f' FROM "{Run._meta.db_table}" r LEFT JOIN {ApiKey._meta.db_table} k ON k.id = r.api_key_id'
    f" LEFT JOIN {User._meta.db_table} u ON u.id = k.principal_id"
    " WHERE r.tenant_id = %s AND r.id = %s"
)


def run_for_page(tenant_id: int, run_id: str) -> Run | None:
    """The tenant's run `run_id` with its API key (None without one) and the key's person
    (None without one) cached, and `last_seq`; None when the tenant has no such run."""
    with connection.cursor() as cursor:
        cursor.execute(_RUN_PAGE, [tenant_id, run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    conn, objects, start = connections[DEFAULT_DB_ALIAS], [], 0
    for model in _PAGE_MODELS:
        end = start + len(model._meta.concrete_fields)
        objects.append(dbvalues.from_row(model, conn, row[start:end]))
        start = end
    run, key, person = objects
    if run.api_key_id is None:
        key = None
    else:
        ApiKey.principal.field.set_cached_value(key, person if key.principal_id else None)
    Run.api_key.field.set_cached_value(run, key)
    run.last_seq = row[-1]
    return run
