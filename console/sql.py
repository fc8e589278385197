"""The console's hand-written SQL: the dashboard's panels, read on every dashboard request and
every 5 seconds while one is open. The ORM's compiling of the same grouped queries (a
filtered count per age bucket, an hour truncation) cost more of this process's CPU than
PostgreSQL spent answering them (`bench_pages --profile dashboard`). PostgreSQL only: on
another database the ORM's queries answer (console/dashboard.py); tests/test_console_sql.py
checks each answer against the ORM's."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from approvals.models import Approval
from runs.models import Event

_APPROVAL = Approval._meta.db_table
_EVENT = Event._meta.db_table


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
