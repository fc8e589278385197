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

from django.db import connection

from approvals.models import Approval, Policy
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
    if connection.vendor != "postgresql":
        return _proposal_lookup_orm(tenant_id, run_id, key, capability_id, object_ref)
    with connection.cursor() as cursor:
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


_LOCK_RUN = (
    f"SELECT {_columns('r', _RUN)} FROM runs_run r WHERE r.id = %s AND r.tenant_id = %s FOR UPDATE"
)


def lock_run(*, tenant_id: int, run_id: str) -> Run | None:
    """The tenant's run, its row locked (it orders the run's proposals and events)."""
    if not connection.features.has_select_for_update:
        return Run.objects.select_for_update().filter(tenant_id=tenant_id, pk=run_id).first()
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_RUN, [run_id, tenant_id])
        row = cursor.fetchone()
    return None if row is None else _make(Run, _RUN, _CONVERT[1], row)


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
    values = [field.get_db_prep_save(field.pre_save(call, True), connection) for field in _CALL]
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_CALL, values)
    call._state.adding, call._state.db = False, connection.alias
    call._remember(_CALL)  # as save() leaves it: it knows what it was written with


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


# --- an approver's decision -----------------------------------------------------------------
# The approve POST read the approval with its tenant, run and call before the business check,
# then locked the approval (with its run, call and policy) and the call (with its run and
# tenant) with two more queries: compiling the three ORM queries was a third of the POST's CPU
# (bench_approve --profile). Written out here: the read, and both locks in one statement —
# the approval's row FOR UPDATE, then the call's FOR NO KEY UPDATE (as tool_call_lock: a row
# that only refers to the call is not held up), in the order the two queries took them.
# The run, tenant and policy are read, not locked (as before): a statement that waited for a
# lock sees their rows as of its start, and the decision uses only what never changes of them
# (ids, the correlation id; a policy version is never edited); the run is locked afresh to
# resume it.
# tests/test_toolcalls_sql_decision.py proves they answer what the ORM's queries answered.
_APPROVAL = Approval._meta.concrete_fields
_POLICY = Policy._meta.concrete_fields
_APPROVAL_CONVERT = _converters(_APPROVAL)
_POLICY_CONVERT = _converters(_POLICY)

# With the approval, the business check's read (calls_effect_pending): the tenant's other calls
# of the capability on the call's object whose effect may not show yet, oldest first.
_DECISION_READ = (
    f"SELECT {_columns('a', _APPROVAL)}, {_columns('t', _TENANT)}, {_columns('r', _RUN)},"
    f" {_columns('c', _CALL)},"
    " (SELECT json_agg(json_build_array(o.id, o.args, o.execution_status,"
    " o.external_request_id, o.external_id) ORDER BY o.created_at, o.id)"
    " FROM toolcalls_toolcall o WHERE o.tenant_id = c.tenant_id"
    " AND o.capability_id = c.capability_id AND o.object_ref = c.object_ref AND o.id <> c.id"
    f" AND (o.execution_status IN ({_PENDING})"
    f" OR (o.execution_status = 'completed' AND o.verification_status IN ({_UNCONFIRMED}))))"
    " FROM approvals_approval a"
    " JOIN runs_tenant t ON t.id = a.tenant_id JOIN runs_run r ON r.id = a.run_id"
    " JOIN toolcalls_toolcall c ON c.id = a.tool_call_id WHERE a.tenant_id = %s AND a.id = %s"
)

_DECISION_LOCK = (
    f"SELECT {_columns('a', _APPROVAL)}, {_columns('p', _POLICY)}, {_columns('c', _CALL)},"
    f" {_columns('r', _RUN)}, {_columns('t', _TENANT)} FROM approvals_approval a"
    " JOIN approvals_policy p ON p.id = a.policy_id"
    " JOIN toolcalls_toolcall c ON c.id = a.tool_call_id JOIN runs_run r ON r.id = c.run_id"
    " JOIN runs_tenant t ON t.id = c.tenant_id WHERE a.tenant_id = %s AND a.id = %s"
    " FOR UPDATE OF a FOR NO KEY UPDATE OF c"
)


def _split(row: tuple, *widths: int) -> list[tuple]:
    parts, start = [], 0
    for width in widths:
        parts.append(row[start : start + width])
        start += width
    return parts


@dataclass(frozen=True)
class DecisionRead:
    approval: Approval  # with its tenant, run and call
    # The other calls on the call's object whose effect may not show yet, oldest first:
    # (id, args, execution_status, external_request_id, external_id).
    open_calls: list[tuple[str, dict, str, str, str]]


def decision_read(*, tenant_id: int, approval_id: str) -> DecisionRead | None:
    """The tenant's approval with its tenant, run and call (as
    `select_related("tenant", "run", "tool_call")`) and the open calls on its call's object
    (as `calls_effect_pending(..., exclude=call)`), nothing locked; None when there is none."""
    if connection.vendor != "postgresql":
        return _decision_read_orm(tenant_id, approval_id)
    with connection.cursor() as cursor:
        cursor.execute(_DECISION_READ, [tenant_id, approval_id])
        row = cursor.fetchone()
    if row is None:
        return None
    a, t, r, c, found = _split(row, len(_APPROVAL), len(_TENANT), len(_RUN), len(_CALL), 1)
    found = found[0]
    if isinstance(found, str | bytes):  # json, as Django's psycopg setup leaves it: text
        found = json.loads(found)
    approval = _make(Approval, _APPROVAL, _APPROVAL_CONVERT, a)
    Approval.tenant.field.set_cached_value(approval, _make(Tenant, _TENANT, _CONVERT[2], t))
    Approval.run.field.set_cached_value(approval, _make(Run, _RUN, _CONVERT[1], r))
    Approval.tool_call.field.set_cached_value(approval, _make(ToolCall, _CALL, _CONVERT[0], c))
    return DecisionRead(approval, [tuple(call) for call in found or []])


def _decision_read_orm(tenant_id: int, approval_id: str) -> DecisionRead | None:
    from toolcalls.selectors import calls_effect_pending

    query = Approval.objects.select_related("tenant", "run", "tool_call")
    approval = query.filter(tenant_id=tenant_id, pk=approval_id).first()
    if approval is None:
        return None
    call = approval.tool_call
    pending = calls_effect_pending(
        tenant=approval.tenant,
        capability_id=call.capability_id,
        object_ref=call.object_ref,
        exclude=call.pk,
    )
    return DecisionRead(
        approval,
        [(o.pk, o.args, o.execution_status, o.external_request_id, o.external_id) for o in pending],
    )


def lock_for_decision(*, tenant_id: int, approval_id: str) -> tuple[Approval, ToolCall] | None:
    """The tenant's approval and its call, both rows locked, in one statement; None when there
    is no such approval. The approval's policy, run, tenant and call are loaded with it: its
    call is the locked call object, and its run and tenant are the call's (the same rows)."""
    if not connection.features.has_select_for_update:
        approval = (
            Approval.objects.select_for_update(of=("self",))
            .select_related("run", "tool_call", "policy")
            .filter(tenant_id=tenant_id, pk=approval_id)
            .first()
        )
        return None if approval is None else (approval, lock_call(approval.tool_call_id))
    with connection.cursor() as cursor:
        cursor.execute(_DECISION_LOCK, [tenant_id, approval_id])
        row = cursor.fetchone()
    if row is None:
        return None
    a, p, rest = _split(row, len(_APPROVAL), len(_POLICY), len(row))
    approval = _make(Approval, _APPROVAL, _APPROVAL_CONVERT, a)
    call = _call_of(rest)
    Approval.policy.field.set_cached_value(approval, _make(Policy, _POLICY, _POLICY_CONVERT, p))
    Approval.tool_call.field.set_cached_value(approval, call)
    if approval.run_id == call.run_id:  # always: an approval is opened in its call's run
        Approval.run.field.set_cached_value(approval, call.run)
    if approval.tenant_id == call.tenant_id:
        Approval.tenant.field.set_cached_value(approval, call.tenant)
    return approval, call
