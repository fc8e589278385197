"""The console's hand-written SQL: the dashboard's panels and figures, read on every dashboard
request, every 5 seconds while one is open, and on every /metrics scrape; and the desk's rows,
read every 5 seconds while the desk is open. The ORM's compiling
of the same grouped queries (filtered counts per bucket, an hour truncation, a subquery per
stale answer) cost more of this process's CPU than PostgreSQL spent answering them
(`bench_pages --profile dashboard`). PostgreSQL only: on another database the ORM's queries
answer (console/dashboard.py, console/metrics.py, console/desk.py); tests/test_console_sql.py,
tests/test_desk_sql.py and the /metrics tests check each answer against the ORM's."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections

from approvals.models import Approval, ApprovalDecision, ApprovalLatency, Policy
from runs import dbvalues
from runs.models import Decision, Event, Run, Tenant, User
from toolcalls.models import DESK_STATUSES, CircuitBreaker, E, Receipt, ToolCall

_APPROVAL = Approval._meta.db_table
_EVENT = Event._meta.db_table
_CALL = ToolCall._meta.db_table


def pending_approvals_newer_than(
    *, tenant_id: int, moments: list[datetime]
) -> tuple[int, list[int]]:
    """The tenant's pending approvals: how many in all, and how many created after each of
    `moments`, in one scan."""
    newer = "".join(", count(*) FILTER (WHERE created_at > %s)" for _ in moments)
    statement = f"SELECT count(*){newer} FROM {_APPROVAL} WHERE tenant_id = %s AND state = %s"
    with connection.cursor() as cursor:
        cursor.execute(statement, [*moments, tenant_id, Approval.State.PENDING])
        total, *counts = cursor.fetchone()
    return total, counts


def events_per_hour(
    *, tenant_id: int, event_types: list[str], since: datetime
) -> list[tuple[str, datetime, int]]:
    """(event type, hour, count) of the tenant's events of `event_types` since `since`, from
    the partial index of counted events. Hours are truncated in the connection's time zone,
    UTC (Django sets it so with USE_TZ): whole hours of UTC, as the chart's hours are."""
    types = ", ".join(["%s"] * len(event_types))
    statement = (
        f"SELECT event_type, date_trunc('hour', occurred_at), count(*) FROM {_EVENT}"
        f" WHERE tenant_id = %s AND event_type IN ({types}) AND occurred_at >= %s"
        " GROUP BY 1, 2"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [tenant_id, *event_types, since])
        return cursor.fetchall()


# --- /metrics and the dashboard's figures (console/metrics.py, `collect`) --------------------

_TENANTS = f"SELECT id, slug FROM {Tenant._meta.db_table} {{scope}} ORDER BY slug"
_CALLS = (
    "SELECT tenant_id, execution_status, verification_status, fencing_token, count(*)"
    f" FROM {_CALL} {{scope}} GROUP BY 1, 2, 3, 4"
)
# The IN names the desk's partial index, as the ORM's query does.
_UNKNOWN = (
    "SELECT tenant_id, min(status_since), count(*){newer} FROM {call}"
    " WHERE execution_status IN ({desk}) AND execution_status = %s{scope} GROUP BY 1"
)
# One statement for the four counts per tenant (metrics.COUNTED_FIGURES).
_COUNTS = (
    "SELECT 'expired_leases', tenant_id, count(*) FROM {call}"
    " WHERE execution_status = %s AND lease_expires_at < %s{scope} GROUP BY 2"
    " UNION ALL SELECT 'runs_needs_human', tenant_id, count(*) FROM {run}"
    " WHERE state = %s{scope} GROUP BY 2"
    # A stale worker's answer that named another external id than the call accepted.
    " UNION ALL SELECT 'duplicate_effects', e.tenant_id, count(*) FROM {event} e"
    " LEFT JOIN {call} c ON c.id = e.tool_call_id"
    " WHERE e.event_type = 'tool_call.stale_result_refused'{event_scope}"
    " AND coalesce(e.payload ->> 'external_id', '') <> ''"
    " AND coalesce(c.external_id, '') <> ''"
    " AND e.payload ->> 'external_id' <> c.external_id GROUP BY 2"
    " UNION ALL SELECT 'remote_dedupe_replays', c.tenant_id, count(*) FROM {receipt} r"
    " JOIN {call} c ON c.id = r.tool_call_id WHERE r.status = %s{call_scope} GROUP BY 2"
)
_BREAKERS = (
    f"SELECT tenant_id, capability_id, state FROM {CircuitBreaker._meta.db_table}"
    " {scope} ORDER BY capability_id"
)
_LATENCY = (
    f"SELECT tenant_id, bucket, count, total_us FROM {ApprovalLatency._meta.db_table} {{scope}}"
)


def metric_rows(
    *, tenant_id: int | None, now: datetime, dwell_since: list[datetime]
) -> dict[str, list[tuple]]:
    """What metrics.metric_rows_orm reads, for one tenant or (None) every tenant: the fields
    of metrics.MetricRows."""
    one = tenant_id is not None
    where = "WHERE tenant_id = %s" if one else ""
    scope, scoped = (" AND tenant_id = %s", [tenant_id]) if one else ("", [])
    newer = "".join(", count(*) FILTER (WHERE status_since >= %s)" for _ in dwell_since)
    desk = ", ".join(["%s"] * len(DESK_STATUSES))
    counts = _COUNTS.format(
        call=_CALL,
        run=Run._meta.db_table,
        event=_EVENT,
        receipt=Receipt._meta.db_table,
        scope=scope,
        event_scope=" AND e.tenant_id = %s" if one else "",
        call_scope=" AND c.tenant_id = %s" if one else "",
    )
    with connection.cursor() as cursor:

        def read(statement: str, params: list) -> list[tuple]:
            cursor.execute(statement, params)
            return cursor.fetchall()

        return dict(
            tenants=read(_TENANTS.format(scope="WHERE id = %s" if one else ""), scoped),
            calls=read(_CALLS.format(scope=where), scoped),
            unknown=read(
                _UNKNOWN.format(newer=newer, call=_CALL, desk=desk, scope=scope),
                [*dwell_since, *DESK_STATUSES, E.RESULT_UNKNOWN, *scoped],
            ),
            counts=read(
                counts,
                [
                    E.DISPATCHING,
                    now,
                    *scoped,
                    Run.State.NEEDS_HUMAN,
                    *scoped,
                    *scoped,
                    Receipt.Status.ALREADY_EXISTS,
                    *scoped,
                ],
            ),
            breakers=read(_BREAKERS.format(scope=where), scoped),
            latency=read(_LATENCY.format(scope=where), scoped),
        )


# --- the unknowns desk (console/desk.py `desk_items`) -----------------------------------------

# The stuck calls' filter as desk._stuck_calls writes it (the IN names the toolcall_desk
# partial index; "not dispatching or lease expired" rather than "unknown", see there).
_STUCK = (
    "{c}.execution_status IN ({desk}) AND {c}.tenant_id = %s"
    " AND (NOT ({c}.execution_status = %s) OR {c}.lease_expires_at < %s)"
)
_DESK_CALLS = (
    "SELECT CASE WHEN c.execution_status = %s THEN %s ELSE c.execution_status END,"
    " c.status_since, c.run_id, r.title, c.id, c.capability_id, c.execution_status,"
    " c.last_error_name, c.desk_owner_id, u.username"
    f" FROM {_CALL} c JOIN {Run._meta.db_table} r ON r.id = c.run_id"
    f" LEFT JOIN {User._meta.db_table} u ON u.id = c.desk_owner_id"
    " WHERE {stuck} ORDER BY c.status_since, c.id LIMIT %s"
)
# Runs handed to a person with none of their calls on the desk, with the time of their last
# run.needs_human event (NULL when they have none: ordered last, as the ORM orders NULLs).
_DESK_RUNS = (
    f"SELECT r.id, r.title, (SELECT e.occurred_at FROM {_EVENT} e"
    " WHERE e.event_type = %s AND e.run_id = r.id ORDER BY e.seq DESC LIMIT 1) AS human_since"
    f" FROM {Run._meta.db_table} r WHERE r.state = %s AND r.tenant_id = %s"
    f" AND NOT EXISTS (SELECT 1 FROM {_CALL} c WHERE {{stuck}} AND c.run_id = r.id)"
    " ORDER BY human_since LIMIT %s"
)


_DESK_BY_CAPABILITY = f"SELECT c.capability_id, count(*) FROM {_CALL} c WHERE {{stuck}} GROUP BY 1"
_DESK_RUNS_COUNT = (
    f"SELECT count(*) FROM {Run._meta.db_table} r WHERE r.state = %s AND r.tenant_id = %s"
    f" AND NOT EXISTS (SELECT 1 FROM {_CALL} c WHERE {{stuck}} AND c.run_id = r.id)"
)


def _stuck(tenant_id: int, now: datetime) -> tuple[str, list]:
    desk = ", ".join(["%s"] * len(DESK_STATUSES))
    return _STUCK.format(c="c", desk=desk), [*DESK_STATUSES, tenant_id, E.DISPATCHING, now]


def desk_calls(*, tenant_id: int, now: datetime, limit: int) -> list[tuple]:
    """The `limit` calls waiting longest on the desk as desk.desk_calls_orm reads them: (kind,
    status_since, run id, run title, id, capability, status, last error, owner id, owner's
    username), in the toolcall_desk index's order."""
    stuck, params = _stuck(tenant_id, now)
    with connection.cursor() as cursor:
        cursor.execute(
            _DESK_CALLS.format(stuck=stuck),
            [E.DISPATCHING, "lease_expired", *params, limit],
        )
        return cursor.fetchall()


def desk_runs(*, tenant_id: int, now: datetime, limit: int) -> list[tuple]:
    """(id, title, time of the last run.needs_human event or None) of the `limit` runs needing
    a person that wait longest, as desk.desk_runs_orm reads them."""
    stuck, params = _stuck(tenant_id, now)
    with connection.cursor() as cursor:
        cursor.execute(
            _DESK_RUNS.format(stuck=stuck),
            ["run.needs_human", Run.State.NEEDS_HUMAN, tenant_id, *params, limit],
        )
        return cursor.fetchall()


def desk_calls_by_capability(*, tenant_id: int, now: datetime) -> list[tuple[str, int]]:
    """(capability, how many of its calls are on the desk), as
    desk.desk_calls_by_capability_orm reads them: from the toolcall_desk index alone."""
    stuck, params = _stuck(tenant_id, now)
    with connection.cursor() as cursor:
        cursor.execute(_DESK_BY_CAPABILITY.format(stuck=stuck), params)
        return cursor.fetchall()


def desk_runs_count(*, tenant_id: int, now: datetime) -> int:
    """How many runs need a person with none of their calls on the desk (desk_runs' rows,
    all of them counted)."""
    stuck, params = _stuck(tenant_id, now)
    with connection.cursor() as cursor:
        cursor.execute(
            _DESK_RUNS_COUNT.format(stuck=stuck), [Run.State.NEEDS_HUMAN, tenant_id, *params]
        )
        return cursor.fetchone()[0]


# --- one desk item (console/views/desk.py `_call`) --------------------------------------------
# The call with its run, tenant and decision, as select_related("run", "decision", "tenant")
# reads it: the ORM's compiling and four instances were a sixth of the desk item's CPU.
_ITEM_MODELS = (ToolCall, Run, Tenant, Decision)


def _columns(model: Any, alias: str) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


_DESK_CALL = (
    f"SELECT {_columns(ToolCall, 'c')}, {_columns(Run, 'r')}, {_columns(Tenant, 't')},"
    f" {_columns(Decision, 'd')} FROM {_CALL} c JOIN {Run._meta.db_table} r ON r.id = c.run_id"
    f" JOIN {Tenant._meta.db_table} t ON t.id = c.tenant_id"
    f" LEFT JOIN {Decision._meta.db_table} d ON d.id = c.decision_id"
    " WHERE c.tenant_id = %s AND c.id = %s"
)


def desk_call(*, tenant_id: int, tool_call_id: str) -> ToolCall | None:
    """The tenant's call `tool_call_id` with its run, tenant and decision (None when it has
    none) cached on it, as the ORM's select_related leaves them; None when there is no such
    call of the tenant."""
    with connection.cursor() as cursor:
        cursor.execute(_DESK_CALL, [tenant_id, tool_call_id])
        row = cursor.fetchone()
    if row is None:
        return None
    call, run, tenant, decision = _instances(_ITEM_MODELS, row)
    ToolCall.run.field.set_cached_value(call, run)
    ToolCall.tenant.field.set_cached_value(call, tenant)
    ToolCall.decision.field.set_cached_value(call, decision if call.decision_id else None)
    return call


def _instances(models: tuple[Any, ...], row: tuple) -> list[Any]:
    """One instance of each model, from its columns of `row` in turn (as _columns lists them)."""
    objects, start = [], 0
    for model in models:
        end = start + len(model._meta.concrete_fields)
        objects.append(dbvalues.from_row(model, connections[DEFAULT_DB_ALIAS], row[start:end]))
        start = end
    return objects


# --- one approval's page (console/views/approvals.py `_get`) -----------------------------------
# The approval with its call, the call's decision, its run, policy and requester, as
# approvals.selectors.approval_get's select_related reads them: compiling that five-table
# query was a seventh of the approval page's CPU (bench_pages --profile "approval page").
_PAGE_MODELS = (Approval, ToolCall, Decision, Run, Policy, User)
_APPROVAL_PAGE = (
    f"SELECT {_columns(Approval, 'a')}, {_columns(ToolCall, 'c')}, {_columns(Decision, 'd')},"
    f" {_columns(Run, 'r')}, {_columns(Policy, 'p')}, {_columns(User, 'u')}"
    f" FROM {_APPROVAL} a JOIN {_CALL} c ON c.id = a.tool_call_id"
    f" LEFT JOIN {Decision._meta.db_table} d ON d.id = c.decision_id"
    f" JOIN {Run._meta.db_table} r ON r.id = a.run_id"
    f" JOIN {Policy._meta.db_table} p ON p.id = a.policy_id"
    f" LEFT JOIN {User._meta.db_table} u ON u.id = a.requested_by_id"
    " WHERE a.tenant_id = %s AND a.id = %s"
)


def approval_for_page(*, tenant_id: int, approval_id: str) -> Approval | None:
    """The tenant's approval `approval_id` with its call (and the call's decision), run,
    policy and requester cached on it (None for a missing decision or requester), as
    approval_get's select_related leaves them; None when the tenant has no such approval."""
    with connection.cursor() as cursor:
        cursor.execute(_APPROVAL_PAGE, [tenant_id, approval_id])
        row = cursor.fetchone()
    if row is None:
        return None
    approval, call, decision, run, policy, user = _instances(_PAGE_MODELS, row)
    ToolCall.decision.field.set_cached_value(call, decision if call.decision_id else None)
    Approval.tool_call.field.set_cached_value(approval, call)
    Approval.run.field.set_cached_value(approval, run)
    Approval.policy.field.set_cached_value(approval, policy)
    Approval.requested_by.field.set_cached_value(
        approval, user if approval.requested_by_id else None
    )
    return approval


# The run's approvals, each with its decisions and their people (a row per decision; one with
# NULLs for an approval nobody decided), in the order the packet lists them: one statement
# where the ORM's prefetch took two and three instances a row.
_DESK_APPROVALS = (
    f'SELECT a.id, a.state, a.rule_name, u.username, d.decision FROM "{_APPROVAL}" a'
    f' LEFT JOIN "{ApprovalDecision._meta.db_table}" d ON d.approval_id = a.id'
    f' LEFT JOIN "{User._meta.db_table}" u ON u.id = d.user_id'
    " WHERE a.run_id = %s ORDER BY a.expires_at, a.id, d.created_at, d.id"
)


def desk_approvals(run_id: str) -> list[tuple]:
    """(approval id, state, rule, decider's username, decision) of the run's approvals, as
    desk.desk_approvals_orm reads them."""
    with connection.cursor() as cursor:
        cursor.execute(_DESK_APPROVALS, [run_id])
        return cursor.fetchall()
