"""The toolcalls app's hand-written SQL for an approver's decision (the approve POST's read and
locks). Kept apart from toolcalls/sql.py, whose helpers it uses, so that each stays readable;
tests/test_toolcalls_sql_decision.py proves the statements answer what the ORM's queries did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connection

from approvals.models import Approval, Policy
from runs.models import Run, Tenant
from toolcalls.models import ToolCall
from toolcalls.sql import (
    _CALL,
    _PENDING,
    _RUN,
    _TENANT,
    _UNCONFIRMED,
    _call_of,
    _columns,
    _row,
    lock_call,
    receivers_want,
)
from toolcalls.webhook_models import Webhook

# --- an approver's decision -----------------------------------------------------------------
# The approve POST read the approval with its tenant, run and call before the business check,
# then locked the approval (with its run, call and policy) and the call (with its run and
# tenant) with two more queries: compiling the three ORM queries was a third of the POST's CPU
# (bench_approve --profile). Written out here: the read, and the locks in one statement —
# the approval's row FOR UPDATE, then the call's FOR NO KEY UPDATE (as tool_call_lock: a row
# that only refers to the call is not held up), in the order the two queries took them, then
# the run's FOR UPDATE (as the events' lock takes it). Every decision appends events, which
# locked the run in a statement of their own after the call (runs/sql.py lock_and_read_head):
# the order is unchanged, and the decision's event batch now only reads the chain head
# (`events.batch(held=...)`), in a statement that starts after this lock was granted. A
# locked row is loaded as it is once its lock is granted, so the run is current. The tenant
# and policy are read, not locked (as before): a statement that waited for a lock sees their
# rows as of its start, and the decision uses only what never changes of them (ids; a policy
# version is never edited).
# tests/test_toolcalls_sql_decision.py proves they answer what the ORM's queries answered.
_APPROVAL = Approval._meta.concrete_fields
_POLICY = Policy._meta.concrete_fields

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

# With the locks, whether a receiver wants the decision (webhooks.approval_decided: an active
# webhook of the tenant, not a chat channel, listing `approval.decided`), which the decision's
# transaction asked in a statement of its own (toolcalls/sql.py, receivers_want: one round trip
# more on the approver's clock). Read in a statement that may wait for the approval's lock, the
# webhooks are read as they were when it started, before the wait: no decision changes a
# webhook (only the console's webhook pages do, in their own transactions), so what the
# previous holder of the lock committed is not missed; a webhook switched on during the wait
# is one switched on after this decision, as it would be a moment later.
_DECISION_LOCK = (
    f"SELECT {_columns('a', _APPROVAL)}, {_columns('p', _POLICY)}, {_columns('c', _CALL)},"
    f" {_columns('r', _RUN)}, {_columns('t', _TENANT)},"
    " EXISTS (SELECT 1 FROM toolcalls_webhook w WHERE w.tenant_id = a.tenant_id AND w.active"
    " AND w.kind <> %s AND w.event_types @> %s::jsonb) FROM approvals_approval a"
    " JOIN approvals_policy p ON p.id = a.policy_id"
    " JOIN toolcalls_toolcall c ON c.id = a.tool_call_id JOIN runs_run r ON r.id = c.run_id"
    " JOIN runs_tenant t ON t.id = c.tenant_id WHERE a.tenant_id = %s AND a.id = %s"
    " FOR UPDATE OF a FOR NO KEY UPDATE OF c FOR UPDATE OF r"
)
# The parameters of its EXISTS: chat channels get no approval.decided (no message).
_DECIDED_RECEIVERS = [
    str(Webhook.Kind.SLACK),
    json.dumps([str(Webhook.EventType.APPROVAL_DECIDED)]),
]


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
    approval = _row(Approval, a)
    Approval.tenant.field.set_cached_value(approval, _row(Tenant, t))
    Approval.run.field.set_cached_value(approval, _row(Run, r))
    Approval.tool_call.field.set_cached_value(approval, _row(ToolCall, c))
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


@dataclass(frozen=True)
class DecisionLock:
    approval: Approval  # with its policy, run, tenant, and `call` as its call
    call: ToolCall  # with its run and tenant
    # Whether a receiver wants `approval.decided` (sql.receivers_want's answer for the tenant).
    decided_wanted: bool


def lock_for_decision(*, tenant_id: int, approval_id: str) -> DecisionLock | None:
    """The tenant's approval, its call and its run, the three rows locked, and whether a
    receiver wants the decision, in one statement; None when there is no such approval. The
    approval's policy, run, tenant and call are loaded with it: its call is the locked call
    object, and its run and tenant are the call's (the same rows)."""
    if not connection.features.has_select_for_update:
        approval = (
            Approval.objects.select_for_update(of=("self",))
            .select_related("run", "tool_call", "policy")
            .filter(tenant_id=tenant_id, pk=approval_id)
            .first()
        )
        if approval is None:
            return None
        call = lock_call(approval.tool_call_id)
        return DecisionLock(approval, call, _decided_wanted(tenant_id))
    with connection.cursor() as cursor:
        cursor.execute(_DECISION_LOCK, [*_DECIDED_RECEIVERS, tenant_id, approval_id])
        row = cursor.fetchone()
    if row is None:
        return None
    a, p, rest = _split(row, len(_APPROVAL), len(_POLICY), len(_CALL) + len(_RUN) + len(_TENANT))
    approval = _row(Approval, a)
    call = _call_of(rest)
    Approval.policy.field.set_cached_value(approval, _row(Policy, p))
    Approval.tool_call.field.set_cached_value(approval, call)
    if approval.run_id == call.run_id:  # always: an approval is opened in its call's run
        Approval.run.field.set_cached_value(approval, call.run)
    if approval.tenant_id == call.tenant_id:
        Approval.tenant.field.set_cached_value(approval, call.tenant)
    return DecisionLock(approval, call, row[-1])


def _decided_wanted(tenant_id: int) -> bool:
    return receivers_want(
        tenant_id=tenant_id,
        event_type=Webhook.EventType.APPROVAL_DECIDED,
        except_kind=Webhook.Kind.SLACK,
    )


# --- the claim of an approved call ------------------------------------------------------------
# The claim read the call's latest approval (`call.approvals.order_by("-created_at").first()`),
# then locked it and read it again with its run and call (approval_consume): two ORM queries,
# two fifths of the claim's CPU (a cProfile of tool_call_claim). One statement: the latest
# approval, locked. It is locked whatever its state (the ORM path locked only an approved one):
# the latest approval of an authorized call is decided already, so no decision waits on it.
# Its run and call are the caller's locked call and its run (the same rows).
_LATEST_APPROVAL_LOCK = (
    f"SELECT {_columns('a', _APPROVAL)} FROM approvals_approval a WHERE a.tool_call_id = %s"
    " ORDER BY a.created_at DESC LIMIT 1 FOR UPDATE OF a"
)


def lock_latest_approval(call: ToolCall) -> Approval | None:
    """The latest approval of `call` (whose row the caller has locked), its row locked, with
    `call` and its run as the approval's call and run; None when it has none."""
    if not connection.features.has_select_for_update:
        approval = call.approvals.order_by("-created_at").first()
    else:
        with connection.cursor() as cursor:
            cursor.execute(_LATEST_APPROVAL_LOCK, [call.pk])
            row = cursor.fetchone()
        approval = None if row is None else _row(Approval, row)
    if approval is None:
        return None
    Approval.tool_call.field.set_cached_value(approval, call)
    if approval.run_id == call.run_id:  # always: an approval is opened in its call's run
        Approval.run.field.set_cached_value(approval, call.run)
    return approval


# --- a decision's resume of its run ---------------------------------------------------------
# The run locked and "any approval of it still pending?" in one statement, for a transaction
# that holds the run's lock already (its event batch took it: runs/events.py, batch_holds_run).
# Only then: a statement that waited for the lock would read the approvals as they were before
# the wait, and miss a decision that committed meanwhile. Holding it, the statement cannot
# wait, and every decision on the run (each appends an event under the same lock) committed
# before this transaction took it, or waits for this one to commit.
_LOCK_HELD_RUN_PENDING = (
    f"SELECT {_columns('r', _RUN)}, EXISTS (SELECT 1 FROM approvals_approval p"
    " WHERE p.run_id = r.id AND p.state = 'pending') FROM runs_run r WHERE r.id = %s FOR UPDATE"
)


def held_run_and_pending(run_id: str) -> tuple[Run, bool] | None:
    """(the run, whether an approval of it is pending), for a run whose lock this transaction
    already holds (PostgreSQL; None when there is no such run)."""
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_HELD_RUN_PENDING, [run_id])
        row = cursor.fetchone()
    return None if row is None else (_row(Run, row[:-1]), row[-1])
