"""Moving finished runs' runtime rows out of the hot tables (`manage.py archive_runs`).

A run is archived once it ended (a terminal state: completed, completed with degradation,
failed permanently, cancelled — not needs_human, which a person may resume), every call of
it is settled, and it ended longer ago than its tenant's `archive_after_days` (or the
command's --older-than). Its rows move, in one transaction per run, to tables of the same
name with `_archive` appended (made on first use as a copy of the hot table's columns, with
no constraints or indexes): decisions, tool calls with their dependencies, attempts and
receipts, approvals with their decisions and notifications, checkpoints, feedback and run
credentials. What stays: the run row (marked `archived_at`; every event points at it) and
the whole event log, to which a `run.archived` event is appended, so the chain goes on and
`verify_event_chain` checks archived runs like any other. PostgreSQL only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from runs import events
from runs.errors import RUN_ARCHIVED, DomainError
from runs.models import Run, Tenant
from toolcalls.models import ToolCall, V

_CALLS = "SELECT id FROM toolcalls_toolcall WHERE run_id = %s"
_APPROVALS = "SELECT id FROM approvals_approval WHERE run_id = %s"
# Children before parents: the foreign keys are checked at commit, the order keeps every
# statement simple. (table, the rows of one run.)
TABLES = (
    ("approvals_notification", f"approval_id IN ({_APPROVALS})"),
    ("approvals_approvaldecision", f"approval_id IN ({_APPROVALS})"),
    ("approvals_approval", "run_id = %s"),
    ("toolcalls_receipt", f"tool_call_id IN ({_CALLS})"),
    ("toolcalls_attempt", "run_id = %s"),
    ("toolcalls_toolcall_depends_on", f"from_toolcall_id IN ({_CALLS})"),
    ("toolcalls_toolcall", "run_id = %s"),
    ("memory_checkpoint", "run_id = %s"),
    ("memory_feedback", "run_id = %s"),
    ("runs_runcredential", "run_id = %s"),
    ("runs_decision", "run_id = %s"),
)


class ArchiveTableMismatch(Exception):
    """An archive table whose columns are no longer the hot table's (a migration changed the
    hot table since): moving rows would put values in the wrong columns."""


@dataclass
class Archived:
    run_id: str
    tenant: str
    state: str
    ended_at: datetime
    moved: dict[str, int] = field(default_factory=dict)


def due_runs(*, older_than: timedelta | None, tenant: Tenant | None = None) -> list[Run]:
    """Finished, settled, not yet archived runs that ended before their cut-off: `older_than`
    for every tenant when given, else each tenant's `archive_after_days` (none: never)."""
    now = timezone.now()
    runs = Run.objects.filter(state__in=Run.TERMINAL_STATES, archived_at__isnull=True)
    if tenant is not None:
        runs = runs.filter(tenant=tenant)
    if older_than is not None:
        runs = runs.filter(_ended_before(now - older_than))
    else:
        by_tenant = Q(pk__in=[])
        for tenant_row in Tenant.objects.filter(archive_after_days__isnull=False):
            cutoff = now - timedelta(days=tenant_row.archive_after_days)
            by_tenant |= Q(tenant=tenant_row) & _ended_before(cutoff)
        runs = runs.filter(by_tenant)
    unsettled = ToolCall.objects.filter(
        Q(execution_status__in=(*ToolCall.ON_ITS_WAY, *ToolCall.UNKNOWN))
        | Q(verification_status=V.PENDING)
    )
    runs = runs.exclude(pk__in=unsettled.values("run_id"))
    return list(runs.select_related("tenant").order_by("id"))


def _ended_before(cutoff: datetime) -> Q:
    # Runs that ended before `ended_at` existed fall back to their last update.
    return Q(ended_at__lt=cutoff) | Q(ended_at__isnull=True, updated_at__lt=cutoff)


def rows_of(run: Run) -> dict[str, int]:
    """How many rows of each table `run_archive` would move (reads only)."""
    counts = {}
    with connection.cursor() as cursor:
        for table, where in TABLES:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE {where}", [run.pk])
            counts[table] = cursor.fetchone()[0]
    return counts


def run_archive(run: Run, *, actor: str, reason: str) -> Archived | None:
    """Move one run's runtime rows to the archive tables and log `run.archived`, in one
    transaction. None when the run changed meanwhile and is not due any more."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("tenant").get(pk=run.pk)
        if run.archived_at is not None or run.state not in Run.TERMINAL_STATES:
            return None
        result = Archived(run.pk, run.tenant.slug, run.state, run.ended_at or run.updated_at)
        with connection.cursor() as cursor:
            for table, where in TABLES:
                _ensure_archive_table(cursor, table)
                cursor.execute(
                    f"WITH moved AS (DELETE FROM {table} WHERE {where} RETURNING *) "
                    f"INSERT INTO {table}_archive SELECT * FROM moved",
                    [run.pk],
                )
                result.moved[table] = cursor.rowcount
        Run.objects.filter(pk=run.pk).update(archived_at=timezone.now())
        events.append(
            run=run,
            event_type="run.archived",
            payload={"moved": {t: n for t, n in result.moved.items() if n}, "reason": reason},
            producer="archive_runs",
            actor=actor,
        )
    return result


def _ensure_archive_table(cursor: object, table: str) -> None:
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {table}_archive (LIKE {table} INCLUDING DEFAULTS)")
    hot, archive = _columns(cursor, table), _columns(cursor, f"{table}_archive")
    if hot != archive:
        raise ArchiveTableMismatch(
            f"{table}_archive has columns {archive}, {table} has {hot}: bring {table}_archive "
            "to the same columns in the same order (ALTER TABLE … ADD COLUMN), then run again."
        )


def _columns(cursor: object, table: str) -> list[str]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]


def refuse_if_archived(run: Run) -> None:
    """Reads built from the hot tables (checkpoints, the resume contract) would show an
    archived run as empty: they say where its rows went instead."""
    if run.archived_at is not None:
        raise DomainError(
            RUN_ARCHIVED,
            f"Run {run.pk} ended ({run.state}) and was archived at "
            f"{run.archived_at.isoformat()}: its rows are in the archive tables; its events, "
            "its eval trace and GET /runs/{id} are still served.",
        )
