"""A dispatch batch's last ORM statements, written out: its messages marked done (the claim),
the tenant's active webhooks and the calls waiting for the confirmed ones (the record); and
the claim's lock, which reads the calls' readiness too (toolcalls/sql.py's two statements in
one: tests/test_toolcalls_sql.py compares them).

Each ran once per batch, and compiling each was more Python than running it (profile_dispatch
--batch 10 --profile: the three were 8 % of the worker's profile, ~1,900 function calls per
batch). tests/test_toolcalls_sql_batch.py proves they read and write what the ORM's queries
did; on another database than PostgreSQL (no `= ANY` of an array) the ORM's query runs.
"""

from __future__ import annotations

from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, connection, connections

from runs import dbvalues
from runs import sql as runs_sql
from runs.lookups import id_array
from runs.models import OutboxMessage
from toolcalls.models import E, ToolCall
from toolcalls.sql import (
    _CALL,
    _READINESS_OF_C,
    _RUN,
    _TENANT,
    Readiness,
    _call_of,
    _columns,
    lock_calls,
    readiness_of,
)
from toolcalls.webhook_models import Webhook

_MARK_DONE = (
    "UPDATE runs_outboxmessage SET done_at = %s WHERE id = ANY(%s::varchar[]) AND done_at IS NULL"
)


def mark_done(outbox_ids: list[str], at: datetime) -> None:
    """`OutboxMessage.objects.filter(pk__in=outbox_ids, done_at=None).update(done_at=at)`."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        OutboxMessage.objects.filter(pk__in=outbox_ids, done_at=None).update(done_at=at)
        return
    runs_sql.cursor_for(conn, _MARK_DONE).execute(_MARK_DONE, [at, id_array(outbox_ids)])


_WEBHOOK = Webhook._meta.concrete_fields
_ACTIVE_HOOKS = (
    f"SELECT {', '.join(f.column for f in _WEBHOOK)} FROM toolcalls_webhook"
    " WHERE tenant_id = %s AND active"
)


def active_webhooks(tenant_id: int) -> list[Webhook]:
    """`list(Webhook.objects.filter(tenant_id=tenant_id, active=True))`."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        return list(Webhook.objects.filter(tenant_id=tenant_id, active=True))
    cursor = runs_sql.cursor_for(conn, _ACTIVE_HOOKS)
    cursor.execute(_ACTIVE_HOOKS, [tenant_id])
    return [dbvalues.from_row(Webhook, conn, row) for row in cursor.fetchall()]


# The join the ORM makes of `depends_on__in`: from_toolcall depends on to_toolcall.
_WAITING = (
    "SELECT DISTINCT c.id FROM toolcalls_toolcall c"
    " JOIN toolcalls_toolcall_depends_on d ON d.from_toolcall_id = c.id"
    " WHERE d.to_toolcall_id = ANY(%s::varchar[]) AND c.execution_status = %s ORDER BY c.id"
)


def authorized_waiting_for(tool_call_ids: list[str]) -> list[str]:
    """The ids of the authorized calls that depend on any of these, in order, each once."""
    conn = connections[DEFAULT_DB_ALIAS]
    authorized = str(E.AUTHORIZED)
    if conn.vendor != "postgresql":
        waiting = ToolCall.objects.filter(
            depends_on__in=tool_call_ids, execution_status=authorized
        ).order_by("pk")
        return list(dict.fromkeys(waiting.values_list("pk", flat=True)))
    cursor = runs_sql.cursor_for(conn, _WAITING)
    cursor.execute(_WAITING, [id_array(tool_call_ids), authorized])
    return [row[0] for row in cursor.fetchall()]


# A batch's claim: its calls locked and their readiness read in one statement. SKIP LOCKED
# never waits for a lock, so the readiness is read as the locks are taken, as the statement
# that followed did microseconds later (a lock that waits could not: a read in the locking
# statement's snapshot would miss what the holder it waited for committed).
_LOCK_MANY_READY = (
    f"SELECT {_columns('c', _CALL)}, {_columns('r', _RUN)}, {_columns('t', _TENANT)},"
    f" {_READINESS_OF_C} FROM toolcalls_toolcall c JOIN runs_run r ON r.id = c.run_id"
    " JOIN runs_tenant t ON t.id = c.tenant_id WHERE c.id = ANY(%s::varchar[])"
    " ORDER BY c.run_id, c.id FOR NO KEY UPDATE OF c SKIP LOCKED"
)


def lock_calls_ready(tool_call_ids: list[str]) -> tuple[list[ToolCall], dict[str, Readiness]]:
    """`lock_calls(ids, skip_locked=True)` and `readiness_of` the calls it locked, in one
    statement (a claim batch: one round trip less per batch)."""
    if not connection.features.has_select_for_update:
        calls = lock_calls(tool_call_ids, skip_locked=True)
        return calls, readiness_of(calls)
    cursor = runs_sql.cursor_for(connections[DEFAULT_DB_ALIAS], _LOCK_MANY_READY)
    cursor.execute(_LOCK_MANY_READY, [id_array(tool_call_ids)])
    rows = cursor.fetchall()
    width = len(_CALL) + len(_RUN) + len(_TENANT)
    calls = [_call_of(row[:width]) for row in rows]
    ready = {
        call.id: Readiness(row[width], bool(row[width + 1]), row[width + 2], row[width + 3])
        for call, row in zip(calls, rows, strict=True)
    }
    return calls, ready
