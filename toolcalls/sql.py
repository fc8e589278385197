"""The toolcalls app's hand-written SQL: the statements of the dispatch path's hottest reads.

Every stage locks its call first, three times per dispatched call; compiling the ORM's
three-table `select_related` query cost more CPU than anything else the worker did (27 % of
it, bench_dispatch's profile). The statement is written out here once and the rows are made
with `from_db`, as the ORM makes them. tests/test_toolcalls_sql.py proves that the objects
equal the ORM's. On a database without row locks (SQLite: the demo) the ORM's query runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from runs.models import Run, Tenant
from toolcalls.models import ToolCall

_CALL = ToolCall._meta.concrete_fields
_RUN = Run._meta.concrete_fields
_TENANT = Tenant._meta.concrete_fields


def _columns(alias: str, fields: Any) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in fields)


# FOR NO KEY UPDATE OF the call alone: see toolcalls/writes.py, tool_call_lock.
_LOCK = (
    f"SELECT {_columns('c', _CALL)}, {_columns('r', _RUN)}, {_columns('t', _TENANT)}"
    " FROM toolcalls_toolcall c JOIN runs_run r ON r.id = c.run_id"
    " JOIN runs_tenant t ON t.id = c.tenant_id WHERE c.id = %s FOR NO KEY UPDATE OF c"
)


def _converters(fields: Any) -> list:
    return [getattr(field, "from_db_value", None) for field in fields]


_CONVERT = (_converters(_CALL), _converters(_RUN), _converters(_TENANT))


def _make(model: Any, fields: Any, converters: list, values: tuple) -> Any:
    converted = [
        value if convert is None or value is None else convert(value, None, connection)
        for convert, value in zip(converters, values, strict=True)
    ]
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


# The same for many calls (a dispatch batch): one statement, in the order of their runs so
# that the batch then locks the runs (appending events) in one order, as every batch does.
_LOCK_MANY = (
    f"SELECT {_columns('c', _CALL)}, {_columns('r', _RUN)}, {_columns('t', _TENANT)}"
    " FROM toolcalls_toolcall c JOIN runs_run r ON r.id = c.run_id"
    " JOIN runs_tenant t ON t.id = c.tenant_id WHERE c.id = ANY(%s)"
    " ORDER BY c.run_id, c.id FOR NO KEY UPDATE OF c"
)


def lock_call(tool_call_id: str) -> ToolCall | None:
    """The call with its run and tenant, the call's row locked; None when there is none."""
    if not connection.features.has_select_for_update:
        return (
            ToolCall.objects.select_for_update(of=("self",), no_key=True)
            .select_related("run", "tenant")
            .filter(pk=tool_call_id)
            .first()
        )
    with connection.cursor() as cursor:
        cursor.execute(_LOCK, [tool_call_id])
        row = cursor.fetchone()
    if row is None:
        return None
    return _call_of(row)


def lock_calls(tool_call_ids: list[str], *, skip_locked: bool = False) -> list[ToolCall]:
    """The calls with their runs and tenants, their rows locked, ordered by run then id. With
    `skip_locked` a call another transaction holds is left out instead of waited for."""
    if not connection.features.has_select_for_update:
        query = ToolCall.objects.select_for_update(of=("self",), no_key=True)
        query = query.select_related("run", "tenant").filter(pk__in=tool_call_ids)
        return list(query.order_by("run_id", "id"))
    statement = _LOCK_MANY + (" SKIP LOCKED" if skip_locked else "")
    with connection.cursor() as cursor:
        cursor.execute(statement, [list(tool_call_ids)])
        rows = cursor.fetchall()
    return [_call_of(row) for row in rows]


def _call_of(row: tuple) -> ToolCall:
    first, second = len(_CALL), len(_CALL) + len(_RUN)
    call = _make(ToolCall, _CALL, _CONVERT[0], row[:first])
    run = _make(Run, _RUN, _CONVERT[1], row[first:second])
    tenant = _make(Tenant, _TENANT, _CONVERT[2], row[second:])
    # As select_related leaves them: the related objects cached on the call.
    ToolCall.run.field.set_cached_value(call, run)
    ToolCall.tenant.field.set_cached_value(call, tenant)
    return call


# What a claim must know before it may send, in one statement: the run's attempts so far,
# whether the call has dependencies at all, the id of the newest version of the capability's
# policy (the cached policy is used while it is still the newest), and the breaker's state (a closed
# or absent breaker needs nothing more).
_READINESS = (
    "SELECT (SELECT count(*) FROM toolcalls_attempt WHERE run_id = %s),"
    " EXISTS (SELECT 1 FROM toolcalls_toolcall_depends_on WHERE from_toolcall_id = %s),"
    " (SELECT id FROM approvals_policy WHERE tenant_id = %s AND capability_id = %s"
    " ORDER BY version DESC LIMIT 1),"
    " (SELECT state FROM toolcalls_circuitbreaker WHERE tenant_id = %s AND capability_id = %s)"
)


@dataclass(frozen=True)
class Readiness:
    attempts_in_run: int
    has_dependencies: bool
    newest_policy_id: int | None
    breaker_state: str | None


def readiness(call: ToolCall) -> Readiness:
    with connection.cursor() as cursor:
        target = [call.tenant_id, call.capability_id]
        cursor.execute(_READINESS, [call.run_id, call.pk, *target, *target])
        attempts, has_dependencies, newest_policy_id, breaker_state = cursor.fetchone()
    return Readiness(attempts, bool(has_dependencies), newest_policy_id, breaker_state)


# The same for many calls in one statement (a dispatch batch), keyed by call id.
_READINESS_MANY = (
    "SELECT c.id, (SELECT count(*) FROM toolcalls_attempt a WHERE a.run_id = c.run_id),"
    " EXISTS (SELECT 1 FROM toolcalls_toolcall_depends_on d WHERE d.from_toolcall_id = c.id),"
    " (SELECT p.id FROM approvals_policy p WHERE p.tenant_id = c.tenant_id"
    " AND p.capability_id = c.capability_id ORDER BY p.version DESC LIMIT 1),"
    " (SELECT b.state FROM toolcalls_circuitbreaker b WHERE b.tenant_id = c.tenant_id"
    " AND b.capability_id = c.capability_id)"
    " FROM toolcalls_toolcall c WHERE c.id = ANY(%s)"
)


def readiness_of(calls: list[ToolCall]) -> dict[str, Readiness]:
    """`readiness` of each call, read in one statement."""
    if not calls:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_READINESS_MANY, [[call.pk for call in calls]])
        rows = cursor.fetchall()
    return {row[0]: Readiness(row[1], bool(row[2]), row[3], row[4]) for row in rows}
