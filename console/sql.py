"""The console's hand-written SQL: the dashboard's panels and figures, read on every dashboard
request, every 5 seconds while one is open, and on every /metrics scrape. The ORM's compiling
of the same grouped queries (filtered counts per bucket, an hour truncation, a subquery per
stale answer) cost more of this process's CPU than PostgreSQL spent answering them
(`bench_pages --profile dashboard`). PostgreSQL only: on another database the ORM's queries
answer (console/dashboard.py, console/metrics.py); tests/test_console_sql.py and the /metrics
tests check each answer against the ORM's."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from approvals.models import Approval, ApprovalLatency
from runs.models import Event, Run, Tenant
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
