"""The approvals app's hand-written SQL: the newest policy's id, read on every proposal and
dispatch to check the policy cache (approvals/policies.py). The ORM's compiling of the
equivalent query cost a fifth of a proposal's CPU (profile_dispatch);
tests/test_toolcalls_sql.py checks the answer against the ORM's."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from runs import dbvalues

_NEWEST = (
    "SELECT id FROM approvals_policy WHERE tenant_id = %s AND capability_id = %s"
    " ORDER BY version DESC LIMIT 1"
)


def newest_policy_id(tenant_id: int, capability_id: str) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(_NEWEST, [tenant_id, capability_id])
        row = cursor.fetchone()
    return row[0] if row else None


# The count in the navigation of every console page (approvals/context_processors.py).
_PENDING = "SELECT count(*) FROM approvals_approval WHERE tenant_id = %s AND state = 'pending'"


def pending_count(tenant_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_PENDING, [tenant_id])
        return cursor.fetchone()[0]


# The decisions so far on one approval, in each decision's transaction (the approval locked):
# the ORM's compilation of `approval.decisions.values_list(...)` was most of its cost
# (bench_approve --profile). tests/test_approvals_sql_decisions.py proves the same answer.
_DECISIONS = (
    "SELECT user_id, decision FROM approvals_approvaldecision WHERE approval_id = %s"
    " ORDER BY created_at, id"
)


def decisions_so_far(approval_id: str) -> list[tuple[int, str]]:
    """(user id, decision) of each decision recorded on the approval, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(_DECISIONS, [approval_id])
        return [tuple(row) for row in cursor.fetchall()]


# A decision's INSERT, written out as runs/sql.py writes its rows (runs/dbvalues.py): compiling
# `ApprovalDecision.objects.create` was a twentieth of the approve POST's CPU (bench_approve
# --profile). The id is the database's (serial): returned by the statement, as the ORM does.
# tests/test_approvals_sql_decisions.py proves the row equals the ORM's.
_INSERT_DECISION: dict[Any, tuple[str, list[int]]] = {}


def insert_decision(decision: Any) -> None:
    """What `decision.save()` does for a new ApprovalDecision (no save signals, no `save()` of
    its own): its row inserted, its `created_at` set and its `id` the row's."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        decision.save(force_insert=True)
        return
    plan = dbvalues.plan(type(decision), conn)
    statement, indexes = _INSERT_DECISION.get(plan.model) or _insert_decision(plan)
    with conn.cursor() as cursor:
        cursor.execute(statement, plan.params(decision, indexes, True))
        decision.pk = cursor.fetchone()[0]
    decision._state.adding, decision._state.db = False, conn.alias


def _insert_decision(plan: dbvalues.Plan) -> tuple[str, list[int]]:
    indexes = [i for i, field in enumerate(plan.fields) if not field.primary_key]
    quote, meta = connection.ops.quote_name, plan.model._meta
    columns = ", ".join(quote(plan.fields[i].column) for i in indexes)
    values = ", ".join(["%s"] * len(indexes))
    statement = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({values})"
        f" RETURNING {quote(meta.pk.column)}"
    )
    _INSERT_DECISION[plan.model] = statement, indexes
    return statement, indexes
