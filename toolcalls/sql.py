"""The toolcalls app's hand-written SQL: the statements of the dispatch path's hottest reads.

Every stage locks its call first, three times per dispatched call; compiling the ORM's
three-table `select_related` query cost more CPU than anything else the worker did (27 % of
it, bench_dispatch's profile). The statement is written out here once and the rows are made
with `from_db`, as the ORM makes them. tests/test_toolcalls_sql.py proves that the objects
equal the ORM's. On a database without row locks (SQLite: the demo) the ORM's query runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import F

from runs import dbvalues
from runs import sql as runs_sql
from runs.lookups import id_array
from runs.models import Run, Tenant
from toolcalls.models import Attempt, ObjectRevision, Receipt, ToolCall

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


def _row(model: Any, values: tuple, conn: Any = None) -> Any:
    return dbvalues.from_row(model, conn or connections[DEFAULT_DB_ALIAS], values)


# The same for many calls (a dispatch batch): one statement, in the order of their runs so
# that the batch then locks the runs (appending events) in one order, as every batch does.
_LOCK_MANY = (
    f"SELECT {_columns('c', _CALL)}, {_columns('r', _RUN)}, {_columns('t', _TENANT)}"
    " FROM toolcalls_toolcall c JOIN runs_run r ON r.id = c.run_id"
    " JOIN runs_tenant t ON t.id = c.tenant_id WHERE c.id = ANY(%s::varchar[])"
    " ORDER BY c.run_id, c.id FOR NO KEY UPDATE OF c"
)
_LOCK_MANY_SKIP_LOCKED = _LOCK_MANY + " SKIP LOCKED"


def lock_call(tool_call_id: str) -> ToolCall | None:
    """The call with its run and tenant, the call's row locked; None when there is none."""
    if not connection.features.has_select_for_update:
        return (
            ToolCall.objects.select_for_update(of=("self",), no_key=True)
            .select_related("run", "tenant")
            .filter(pk=tool_call_id)
            .first()
        )
    cursor = runs_sql.cursor_for(connections[DEFAULT_DB_ALIAS], _LOCK)
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
    statement = _LOCK_MANY_SKIP_LOCKED if skip_locked else _LOCK_MANY
    cursor = runs_sql.cursor_for(connections[DEFAULT_DB_ALIAS], statement)
    cursor.execute(statement, [id_array(tool_call_ids)])
    rows = cursor.fetchall()
    return [_call_of(row) for row in rows]


def _call_of(row: tuple) -> ToolCall:
    first, second = len(_CALL), len(_CALL) + len(_RUN)
    conn = connections[DEFAULT_DB_ALIAS]  # once for the three rows, not per row
    call = dbvalues.from_row(ToolCall, conn, row[:first])
    run = dbvalues.from_row(Run, conn, row[first:second])
    tenant = dbvalues.from_row(Tenant, conn, row[second:])
    # As select_related leaves them: the related objects cached on the call.
    ToolCall.run.field.set_cached_value(call, run)
    ToolCall.tenant.field.set_cached_value(call, tenant)
    return call


# What a claim must know before it may send, in one statement: the run's attempts so far,
# whether the call has dependencies at all, the id of the newest version of the capability's
# policy (the cached policy is used while it is still the newest), and the breaker's state (a closed
# or absent breaker needs nothing more).
# The run's id as a sub-select, hidden from the planner: see sql_propose.py's _TALLY (the claim
# of an approved call in a small run was planned anew each time, 0.3 ms on the click's path).
_READINESS = (
    "SELECT (SELECT count(*) FROM toolcalls_attempt"
    " WHERE run_id = (SELECT CAST(%s AS varchar))),"
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
_READINESS_OF_C = (
    "(SELECT count(*) FROM toolcalls_attempt a WHERE a.run_id = c.run_id),"
    " EXISTS (SELECT 1 FROM toolcalls_toolcall_depends_on d WHERE d.from_toolcall_id = c.id),"
    " (SELECT p.id FROM approvals_policy p WHERE p.tenant_id = c.tenant_id"
    " AND p.capability_id = c.capability_id ORDER BY p.version DESC LIMIT 1),"
    " (SELECT b.state FROM toolcalls_circuitbreaker b WHERE b.tenant_id = c.tenant_id"
    " AND b.capability_id = c.capability_id)"
)
_READINESS_MANY = f"SELECT c.id, {_READINESS_OF_C} FROM toolcalls_toolcall c WHERE c.id = ANY(%s)"


def readiness_of(calls: list[ToolCall]) -> dict[str, Readiness]:
    """`readiness` of each call, read in one statement."""
    if not calls:
        return {}
    cursor = runs_sql.cursor_for(connections[DEFAULT_DB_ALIAS], _READINESS_MANY)
    cursor.execute(_READINESS_MANY, [[call.pk for call in calls]])
    rows = cursor.fetchall()
    return {row[0]: Readiness(row[1], bool(row[2]), row[3], row[4]) for row in rows}


# --- the proposal path ----------------------------------------------------------------------
# A proposal read its run, its idempotency key and the open calls on its object with three
# ORM queries, locked the run and counted its calls with two more and inserted the call with
# a sixth: compiling them was over a third of the proposer's CPU (profile_propose). The
# statements are written out here; tests/test_toolcalls_sql_propose.py proves they answer and
# write what the ORM did. Other databases (SQLite: the demo) take the ORM's way.

_PENDING = ", ".join(f"'{status}'" for status in ToolCall.EFFECT_PENDING)
_UNCONFIRMED = ", ".join(f"'{status}'" for status in ToolCall.UNCONFIRMED)
# The run (of this tenant), the call already holding the key, and the tenant's calls of the
# capability on the object whose effect may not show yet (selectors.calls_effect_pending).
_LOOKUP = (
    "SELECT r.id, r.correlation_id,"
    " (SELECT k.id FROM toolcalls_toolcall k WHERE k.tenant_id = %s AND k.idempotency_key = %s),"
    " (SELECT json_agg(json_build_array(o.id, o.args, o.execution_status,"
    " o.external_request_id, o.external_id) ORDER BY o.created_at, o.id)"
    " FROM toolcalls_toolcall o WHERE o.tenant_id = %s AND o.capability_id = %s"
    f" AND o.object_ref = %s AND (o.execution_status IN ({_PENDING})"
    f" OR (o.execution_status = 'completed' AND o.verification_status IN ({_UNCONFIRMED}))))"
    " FROM runs_run r WHERE r.id = %s AND r.tenant_id = %s"
)


@dataclass(frozen=True)
class ProposalLookup:
    run_id: str
    correlation_id: str
    existing_call_id: str | None
    # (id, args, execution_status, external_request_id, external_id), oldest first.
    open_calls: list[tuple[str, dict, str, str, str]]


def proposal_lookup(
    *, tenant_id: int, run_id: str, key: str, capability_id: str, object_ref: str
) -> ProposalLookup | None:
    """What a proposal reads before its business check, in one statement; None when the
    tenant has no such run."""
    conn = connections[DEFAULT_DB_ALIAS]  # once: each `connection.…` looks it up again
    if conn.vendor != "postgresql":
        return _proposal_lookup_orm(tenant_id, run_id, key, capability_id, object_ref)
    cursor = runs_sql.cursor_for(conn, _LOOKUP)
    target = [tenant_id, capability_id, object_ref]
    cursor.execute(_LOOKUP, [tenant_id, key, *target, run_id, tenant_id])
    row = cursor.fetchone()
    if row is None:
        return None
    found = row[3]
    if isinstance(found, str | bytes):  # json, as Django's psycopg setup leaves it: text
        found = json.loads(found)
    return ProposalLookup(row[0], row[1], row[2], [tuple(call) for call in found or []])


def _proposal_lookup_orm(
    tenant_id: int, run_id: str, key: str, capability_id: str, object_ref: str
) -> ProposalLookup | None:
    from toolcalls.selectors import calls_effect_pending

    run = Run.objects.filter(tenant_id=tenant_id, pk=run_id).values("correlation_id").first()
    if run is None:
        return None
    existing = ToolCall.objects.filter(tenant_id=tenant_id, idempotency_key=key)
    pending = calls_effect_pending(
        tenant=Tenant(pk=tenant_id), capability_id=capability_id, object_ref=object_ref
    )
    return ProposalLookup(
        run_id,
        run["correlation_id"],
        existing.values_list("pk", flat=True).first(),
        [(c.pk, c.args, c.execution_status, c.external_request_id, c.external_id) for c in pending],
    )


_LOCK_RUN = f"SELECT {_columns('r', _RUN)} FROM runs_run r WHERE r.id = %s FOR UPDATE"
_LOCK_TENANT_RUN = (
    f"SELECT {_columns('r', _RUN)} FROM runs_run r WHERE r.id = %s AND r.tenant_id = %s FOR UPDATE"
)


def lock_run(*, tenant_id: int | None, run_id: str) -> Run | None:
    """The run (the tenant's, unless `tenant_id` is None: a worker's, by the id of a row it
    holds), its row locked (it orders the run's proposals and events)."""
    conn = connections[DEFAULT_DB_ALIAS]  # once: each `connection.…` looks it up again
    if not conn.features.has_select_for_update:
        runs = Run.objects.select_for_update().filter(pk=run_id)
        return (runs if tenant_id is None else runs.filter(tenant_id=tenant_id)).first()
    if tenant_id is None:
        cursor = runs_sql.cursor_for(conn, _LOCK_RUN)
        cursor.execute(_LOCK_RUN, [run_id])
    else:
        cursor = runs_sql.cursor_for(conn, _LOCK_TENANT_RUN)
        cursor.execute(_LOCK_TENANT_RUN, [run_id, tenant_id])
    row = cursor.fetchone()
    return None if row is None else _row(Run, row, conn)


def calls_in_run(run_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM toolcalls_toolcall WHERE run_id = %s", [run_id])
        return cursor.fetchone()[0]


_INSERT_CALL = (
    f"INSERT INTO toolcalls_toolcall ({', '.join(f.column for f in _CALL)})"
    f" VALUES ({', '.join(['%s'] * len(_CALL))})"
)


def insert_call(call: ToolCall) -> None:
    """INSERT a new call as `call.save(force_insert=True)` does (auto_now dates set, values
    prepared by their fields), without compiling it. ToolCall has no save signals."""
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_CALL, call_values(call))
    call_inserted(call)


def call_values(call: ToolCall, conn: Any = None) -> list[Any]:
    """The new call's column values, as `save(force_insert=True)` prepares them (`conn`: the
    default database's connection, when the caller has it)."""
    plan = dbvalues.plan(ToolCall, conn or connections[DEFAULT_DB_ALIAS])
    return plan.params(call, plan.every, True)


def call_inserted(call: ToolCall) -> None:
    call._state.adding, call._state.db = False, connection.alias
    call._remember_all()  # as save() leaves it: it knows what it was written with


# --- the result envelope --------------------------------------------------------------------
# Every API answer about a call (and every webhook) says how many attempts it had, which call
# compensates it, which calls it waits for and what people decided: three ORM queries and
# one for approvals, compiled per answer, were a third of a proposal's API request. One
# statement here (the approvals are read only when there are some);
# tests/test_toolcalls_sql_propose.py compares it with the ORM's answers.
_RELATIONS = (
    "SELECT (SELECT count(*) FROM toolcalls_attempt WHERE tool_call_id = %s),"
    " (SELECT id FROM toolcalls_toolcall WHERE compensation_of_id = %s),"
    " ARRAY(SELECT to_toolcall_id FROM toolcalls_toolcall_depends_on"
    " WHERE from_toolcall_id = %s ORDER BY to_toolcall_id),"
    " EXISTS (SELECT 1 FROM approvals_approval WHERE tool_call_id = %s)"
)


@dataclass(frozen=True)
class Relations:
    attempts: int
    compensation_id: str | None  # the call compensating this one
    depends_on: list[str]  # in id order, as `call.depends_on.all()`
    has_approvals: bool


NO_RELATIONS = Relations(0, None, [], False)


def call_relations(call: ToolCall) -> Relations:
    """What `call.attempts.count()`, `call.compensation`, `call.depends_on.all()` and
    `call.approvals.exists()` say, in one statement."""
    if connection.vendor != "postgresql":
        compensation = ToolCall.objects.filter(compensation_of=call).values_list("pk", flat=True)
        return Relations(
            call.attempts.count(),
            compensation.first(),
            [dependency.pk for dependency in call.depends_on.all()],
            call.approvals.exists(),
        )
    with connection.cursor() as cursor:
        cursor.execute(_RELATIONS, [call.pk] * 4)
        attempts, compensation_id, depends_on, has_approvals = cursor.fetchone()
    return Relations(attempts, compensation_id, list(depends_on), has_approvals)


# The run page's calls table: the attempts and receipts of a page of calls, in one statement
# (two ORM queries before, whose compilation cost more than their reading).
_STEPS = (
    "SELECT 0, tool_call_id, number, classification, error_name, NULL, NULL"
    " FROM toolcalls_attempt WHERE tool_call_id = ANY(%s)"
    " UNION ALL"
    " SELECT 1, tool_call_id, NULL, external_id, status, source, id"
    " FROM toolcalls_receipt WHERE tool_call_id = ANY(%s)"
    " ORDER BY 1, 2, 3, 7"
)


def call_steps(ids: list[str]) -> dict[str, dict[str, list[tuple]]]:
    """By call id: its attempts (number, classification, error name) by number and its
    receipts (external id, status, source) by id, as selectors.call_steps gives them."""
    steps: dict[str, dict[str, list[tuple]]] = {pk: {"attempts": [], "receipts": []} for pk in ids}
    if not ids:
        return steps
    if connection.vendor != "postgresql":
        return _call_steps_orm(ids, steps)
    with connection.cursor() as cursor:
        cursor.execute(_STEPS, [ids, ids])
        for kind, call_id, number, first, second, third, _ in cursor.fetchall():
            if kind == 0:
                steps[call_id]["attempts"].append((number, first, second))
            else:
                steps[call_id]["receipts"].append((first, second, third))
    return steps


def _call_steps_orm(
    ids: list[str], steps: dict[str, dict[str, list[tuple]]]
) -> dict[str, dict[str, list[tuple]]]:
    attempts = (
        Attempt.objects.filter(tool_call_id__in=ids)
        .order_by("tool_call_id", "number")
        .values_list("tool_call_id", "number", "classification", "error_name")
    )
    for call_id, *attempt in attempts:
        steps[call_id]["attempts"].append(tuple(attempt))
    receipts = (
        Receipt.objects.filter(tool_call_id__in=ids)
        .order_by("tool_call_id", "id")
        .values_list("tool_call_id", "external_id", "status", "source")
    )
    for call_id, *receipt in receipts:
        steps[call_id]["receipts"].append(tuple(receipt))
    return steps


# --- the record step's writes ---------------------------------------------------------------
# A dispatch batch ended each call's attempt, bumped its object's revision and wrote its
# receipt and verification message with one ORM statement per call, each compiled
# (profile_dispatch --profile). toolcalls/record.py gathers them and writes each kind in one
# statement here; tests/test_toolcalls_sql_record.py proves the rows are the ORM's.


@dataclass(frozen=True)
class AttemptEnd:
    attempt_id: str
    classification: str
    ended_at: Any  # datetime
    error_name: str
    http_status: int | None


# The ends as one JSON parameter (orjson, in C) rather than five arrays, each dumped element
# by element by psycopg's Python list dumper (a batch's arrays were ~5 % of its profile).
_END_ATTEMPTS = (
    "UPDATE toolcalls_attempt a SET classification = v.classification, ended_at = v.ended_at,"
    " error_name = v.error_name, http_status = v.http_status"
    " FROM json_to_recordset(%s::json) AS v(id varchar, classification varchar,"
    " ended_at timestamptz, error_name varchar, http_status int) WHERE a.id = v.id"
)


def end_attempts(ends: list[AttemptEnd]) -> None:
    """What `Attempt.objects.filter(pk=…).update(classification=…, ended_at=…, error_name=…,
    http_status=…)` writes for each, in one statement (ended_at: an aware datetime, as
    timezone.now() gives it; orjson writes it with its offset)."""
    if not ends:
        return
    if connection.vendor != "postgresql":
        for end in ends:
            Attempt.objects.filter(pk=end.attempt_id).update(
                classification=end.classification,
                ended_at=end.ended_at,
                error_name=end.error_name,
                http_status=end.http_status,
            )
        return
    rows = [
        {
            "id": e.attempt_id,
            "classification": e.classification,
            "ended_at": e.ended_at,
            "error_name": e.error_name,
            "http_status": e.http_status,
        }
        for e in ends
    ]
    cursor = runs_sql.cursor_for(connections[DEFAULT_DB_ALIAS], _END_ATTEMPTS)
    cursor.execute(_END_ATTEMPTS, [orjson.dumps(rows).decode()])


_BUMP_REVISIONS = (
    "UPDATE toolcalls_objectrevision o SET revision = o.revision + v.writes"
    " FROM unnest(%s::bigint[], %s::varchar[], %s::int[]) AS v(tenant_id, ref, writes)"
    " WHERE o.tenant_id = v.tenant_id AND o.ref = v.ref RETURNING o.tenant_id, o.ref"
)


def bump_revisions(writes: dict[tuple[int, str], int]) -> set[tuple[int, str]]:
    """Move each (tenant id, object ref) on by its number of completed writes, as
    `ObjectRevision.objects.filter(tenant_id=…, ref=…).update(revision=F("revision") + 1)`
    once per write does (auto_now `updated_at` untouched, as QuerySet.update leaves it).
    Returns the objects that have a revision row (the ones that moved)."""
    if not writes:
        return set()
    if connection.vendor != "postgresql":
        moved = set()
        for (tenant_id, ref), count in writes.items():
            rows = ObjectRevision.objects.filter(tenant_id=tenant_id, ref=ref)
            if rows.update(revision=F("revision") + count):
                moved.add((tenant_id, ref))
        return moved
    keys = list(writes)
    cursor = runs_sql.cursor_for(connections[DEFAULT_DB_ALIAS], _BUMP_REVISIONS)
    cursor.execute(
        _BUMP_REVISIONS,
        [[k[0] for k in keys], [k[1] for k in keys], [writes[k] for k in keys]],
    )
    return {(tenant_id, ref) for tenant_id, ref in cursor.fetchall()}


# --- the approve POST's two questions -------------------------------------------------------
# Asked in every decision's transaction; the ORM's compilation of each was most of its cost
# (bench_approve --profile). tests/test_toolcalls_sql_decision.py proves they answer as the
# ORM's queries did.
_RECEIVERS_WANT = (
    "SELECT EXISTS (SELECT 1 FROM toolcalls_webhook WHERE tenant_id = %s AND active"
    " AND kind <> %s AND event_types @> %s::jsonb)"
)
_APPROVAL_PENDING = (
    "SELECT EXISTS (SELECT 1 FROM approvals_approval WHERE run_id = %s AND state = 'pending')"
)


def receivers_want(*, tenant_id: int, event_type: str, except_kind: str) -> bool:
    """Whether an active webhook of the tenant, not of `except_kind`, lists `event_type`."""
    if connection.vendor != "postgresql":  # no jsonb containment
        from toolcalls.webhook_models import Webhook

        hooks = Webhook.objects.filter(tenant_id=tenant_id, active=True).exclude(kind=except_kind)
        return any(event_type in hook.event_types for hook in hooks)
    with connection.cursor() as cursor:
        wanted = json.dumps([str(event_type)])
        cursor.execute(_RECEIVERS_WANT, [tenant_id, str(except_kind), wanted])
        return cursor.fetchone()[0]


def approval_pending_in_run(run_id: str) -> bool:
    """Whether an approval of the run is still pending."""
    with connection.cursor() as cursor:
        cursor.execute(_APPROVAL_PENDING, [run_id])
        return cursor.fetchone()[0]
