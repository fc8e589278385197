"""The approvals app's hand-written SQL: the newest policy's id, read on every proposal and
dispatch to check the policy cache (approvals/policies.py). The ORM's compiling of the
equivalent query cost a fifth of a proposal's CPU (profile_dispatch);
tests/test_toolcalls_sql.py checks the answer against the ORM's."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, connection, connections

from approvals.models import Approval
from runs import dbvalues
from runs.sql import HEAD_FIELDS, READ_HEAD

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


# What the inbox's poll compares (approvals/selectors.py inbox_state): COUNT(*) and the
# newest updated_at, both from the approval_changed index alone.
_INBOX_STATE = (
    "SELECT count(*), max(updated_at) FROM approvals_approval"
    " WHERE tenant_id = %s AND state = 'pending'"
)


def inbox_state(tenant_id: int) -> tuple[int, datetime | None]:
    with connection.cursor() as cursor:
        cursor.execute(_INBOX_STATE, [tenant_id])
        count, latest = cursor.fetchone()
    return count, latest


# A page of the inbox (approvals/selectors.py inbox_page), the columns its rows show, in the
# order of selectors.inbox: the ORM's compiling of that query, its subquery and two joins,
# and the 51 approvals and runs it made were two fifths of the inbox's CPU (bench_pages
# --profile inbox). The order starts with the index (tenant, state, expires_at).
_INBOX_PAGE = (
    "SELECT a.id, c.capability_id, a.args, a.summary, a.risk,"
    " (SELECT count(*) FROM approvals_approvaldecision d"
    "  WHERE d.approval_id = a.id AND d.decision <> 'reject'),"
    " a.required_approvers, a.expires_at, a.rule_name, a.policy_version, a.run_id, r.title"
    " FROM approvals_approval a JOIN toolcalls_toolcall c ON c.id = a.tool_call_id"
    " JOIN runs_run r ON r.id = a.run_id"
    " WHERE a.tenant_id = %s AND a.state = 'pending'"
    " ORDER BY a.expires_at, CASE a.risk WHEN 'high' THEN 0 WHEN 'medium' THEN 1 ELSE 2 END, a.id"
    " LIMIT %s OFFSET %s"
)


def inbox_page(tenant_id: int, offset: int, limit: int) -> list[tuple]:
    """The columns of selectors.InboxRow, the arguments decoded as the ORM decodes them."""
    with connection.cursor() as cursor:
        cursor.execute(_INBOX_PAGE, [tenant_id, limit, offset])
        rows = cursor.fetchall()
    decode = Approval._meta.get_field("args").from_db_value
    return [(*row[:2], decode(row[2], None, connection), *row[3:]) for row in rows]


# The decisions so far on one approval, as `approval.decisions.values_list(...)` reads them
# (tests/test_approvals_sql_decisions.py). A decision reads them in its own INSERT's statement
# on PostgreSQL (record_decision, below); this is the read of other databases.
_DECISIONS = (
    "SELECT user_id, decision FROM approvals_approvaldecision WHERE approval_id = %s"
    " ORDER BY created_at, id"
)


def decisions_so_far(approval_id: str) -> list[tuple[int, str]]:
    """(user id, decision) of each decision recorded on the approval, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(_DECISIONS, [approval_id])
        return [tuple(row) for row in cursor.fetchall()]


# A decision: the decisions so far on its approval and its own INSERT in one statement (the
# approval is locked: decisions on it take turns). Its person's decision is not inserted when
# they decided already (the caller refuses it; the unique constraint is the backstop). Written
# out as runs/sql.py writes its rows (runs/dbvalues.py): compiling `ApprovalDecision.objects.
# create` was a twentieth of the approve POST's CPU (bench_approve --profile), and each
# statement is a round trip on the approver's clock. The id is the database's (serial), as the
# ORM's. tests/test_decision_writes_sql.py proves the answer and the row equal the ORM's.
#
# With them, whether another approval of the approval's run is pending (a row of kind 2 when
# one is): the run's resume after the decision asks it (toolcalls/lifecycle.py), which took a
# statement of its own after the decision's writes. Every decision runs this after its lock
# statement has locked the run (toolcalls/sql_decision.py lock_for_decision), so it starts
# once that lock is granted and sees every decision that committed before; and no approval of
# the run changes state while the lock is held (each change appends an event, which locks the
# run), so it answers what a read at the resume would. This approval itself is left out: its
# own decision changes its state later in the transaction.
#
# And, for the same reason, the run's chain head with the id of the call's last event (a row
# of kind 3, none when the run has no event yet): runs/sql.py READ_HEAD, which
# lock_and_read_head(held=True) sends as a statement of its own for the decision's events,
# here as a branch: one round trip fewer on the approver's clock.
_NULLS = "NULL, NULL, NULL, NULL, NULL"
_RECORD = (
    "WITH earlier AS (SELECT user_id, decision, created_at, id FROM approvals_approvaldecision"
    " WHERE approval_id = %s), added AS (INSERT INTO {table} ({columns}) SELECT {values}"
    " WHERE NOT EXISTS (SELECT 1 FROM earlier WHERE user_id = %s) RETURNING {pk})"
    # Typed in the first branch: the others' NULLs take its types.
    " SELECT 0, created_at, id, user_id, decision, NULL::varchar, NULL::integer, NULL::varchar,"
    " NULL::varchar, NULL::varchar FROM earlier"
    f" UNION ALL SELECT 1, NULL, {{pk}}, NULL, NULL, {_NULLS} FROM added"
    f" UNION ALL SELECT 2, NULL, NULL, NULL, NULL, {_NULLS} WHERE EXISTS (SELECT 1"
    " FROM approvals_approval p WHERE p.run_id = %s AND p.state = 'pending' AND p.id <> %s)"
    f" UNION ALL SELECT 3, NULL, NULL, NULL, NULL, h.* FROM ({READ_HEAD}) h ORDER BY 1, 2, 3"
)
_RECORD_MADE: dict[Any, tuple[str, list[int]]] = {}


def record_decision(decision: Any, run_id: str = "") -> Recorded | None:
    """The decisions recorded before `decision` on its approval, (user id, decision) oldest
    first; and `decision` saved (a new ApprovalDecision: its row inserted, `created_at` set, `id`
    the row's), unless its person has a decision there already: then None, nothing written.
    With `run_id` (the approval's run, locked by this transaction already), on PostgreSQL,
    also whether another approval of the run is pending, and the run's chain head with the
    last event of the approval's call (both None otherwise: not asked)."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        earlier = decisions_so_far(decision.approval_id)
        if any(user_id == decision.user_id for user_id, _ in earlier):
            return None
        decision.save(force_insert=True)
        return Recorded(earlier, None, None)
    plan = dbvalues.plan(type(decision), conn)
    statement, indexes = _RECORD_MADE.get(plan.model) or _record_statement(plan)
    params = [decision.approval_id, *plan.params(decision, indexes, True), decision.user_id]
    # NULL matches no row: without the run, neither question is asked.
    asked = run_id or None
    call_id = decision.approval.tool_call_id if run_id else None
    with conn.cursor() as cursor:
        cursor.execute(statement, [*params, asked, decision.approval_id, call_id, asked])
        rows = cursor.fetchall()
    head: Head | None = Head(None, "") if run_id else None
    if rows and rows[-1][0] == 3:
        last = rows.pop()
        head = Head(dict(zip(HEAD_FIELDS, last[5:9], strict=True)), last[9] or "")
    others_pending = bool(rows) and rows[-1][0] == 2
    if others_pending:
        rows.pop()
    if not rows or rows[-1][0] != 1:
        return None
    decision.pk = rows[-1][2]
    decision._state.adding, decision._state.db = False, conn.alias
    earlier = [(user_id, kind) for _, _, _, user_id, kind, *_ in rows[:-1]]
    return Recorded(earlier, others_pending if run_id else None, head)


class Head(NamedTuple):
    """What runs/sql.py lock_and_read_head answers: the run's last event (id, seq, hash,
    tool_call_id; None when it has none) and the id of the call's last event ('' when none)."""

    last: dict[str, Any] | None
    last_of_call: str


class Recorded(NamedTuple):
    earlier: list[tuple[int, str]]  # (user id, decision) of the decisions before, oldest first
    others_pending: bool | None  # another approval of the run pending (None: not asked)
    head: Head | None  # the run's chain head, read after its lock (None: not asked)


def _record_statement(plan: dbvalues.Plan) -> tuple[str, list[int]]:
    indexes = [i for i, field in enumerate(plan.fields) if not field.primary_key]
    quote, meta = connection.ops.quote_name, plan.model._meta
    fields = [plan.fields[i] for i in indexes]
    statement = _RECORD.format(
        table=quote(meta.db_table),
        columns=", ".join(quote(field.column) for field in fields),
        # Typed: an untyped NULL in a SELECT list is text, which a jsonb column refuses.
        values=", ".join(f"%s::{field.cast_db_type(connection)}" for field in fields),
        pk=quote(meta.pk.column),
    )
    _RECORD_MADE[plan.model] = statement, indexes
    return statement, indexes
