"""The approvals app's hand-written SQL: the newest policy's id, read on every proposal and
dispatch to check the policy cache (approvals/policies.py). The ORM's compiling of the
equivalent query cost a fifth of a proposal's CPU (profile_dispatch);
tests/test_toolcalls_sql.py checks the answer against the ORM's."""

from __future__ import annotations

from django.db import connection

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
