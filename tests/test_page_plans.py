"""The console pages' slow queries at a million events read the index made for each, in the
page's order (issue #12, `bench_pages`): no sort of every call on a busy object, of every
desk item or of a person's every event, and no table reads for counts an index holds.

PostgreSQL is asked for each query's plan with sequential scans, bitmap scans and sorts
switched off (and plain index scans, where the index alone must answer): on a test database
of a few rows it would rightly pick them, and a plan that still needs one is what the index
was meant to spare."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Value
from django.utils import timezone

from approvals.selectors import inbox_state
from console import dashboard, desk
from console.audit import AuditQuery, audit_events
from runs.actors import ActorPerson, person_of
from runs.models import Run, Tenant
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls import selectors
from toolcalls.models import E, ToolCall

SCANS_OFF = ("enable_seqscan", "enable_bitmapscan", "enable_sort")


def statements(read: Callable[[], object]) -> list[tuple[str, tuple]]:
    """Every statement `read` sends, with its parameters."""
    sent: list[tuple[str, tuple]] = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        read()
    return sent


def plan(sql: str, params: tuple, *, off: tuple[str, ...] = SCANS_OFF) -> str:
    with connection.cursor() as cursor:
        for setting in off:
            cursor.execute(f"SET {setting} = off")
        try:
            cursor.execute("EXPLAIN " + sql, params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            for setting in off:
                cursor.execute(f"RESET {setting}")


def _first_table(sql: str) -> str:
    return re.search(r'FROM "?(\w+)"?', sql).group(1)


def plan_of(read: Callable[[], object], table: str, **options: tuple[str, ...]) -> str:
    """The plan of the one statement of `read` that reads `table` first."""
    (found,) = [(sql, p) for sql, p in statements(read) if _first_table(sql) == table]
    return plan(*found, **options)


def test_the_approval_page_reads_the_newest_calls_on_the_object_first(tenant: Tenant) -> None:
    def read() -> None:
        selectors.calls_on_object(
            tenant=tenant,
            object_ref="order:order-015",
            since=timezone.now() - timedelta(days=1),
            capability_id="refund-order-v2",
            exclude="tc_x",
        )

    shown = plan_of(read, "toolcalls_toolcall")
    assert "toolcall_obj" in shown
    assert "Sort" not in shown


def test_the_desk_reads_its_longest_waits_in_the_index_order(tenant: Tenant) -> None:
    shown = plan_of(lambda: desk.desk_items(tenant=tenant, limit=100), "toolcalls_toolcall")
    assert "toolcall_desk" in shown
    assert "Sort" not in shown


def test_the_desk_counts_from_its_index_alone(tenant: Tenant) -> None:
    off = (*SCANS_OFF, "enable_indexscan")
    read = lambda: desk.desk_counts(tenant=tenant)  # noqa: E731
    assert "Index Only Scan using toolcall_desk" in plan_of(read, "toolcalls_toolcall", off=off)
    assert "run_needs_human" in plan_of(read, "runs_run", off=SCANS_OFF)


def test_the_planner_expects_as_many_desk_items_as_there_are(tenant: Tenant, run: Run) -> None:
    """`status IN desk statuses AND status IN unknown` twice over made PostgreSQL expect a
    few rows of thousands, and so sort them all rather than read the first hundred in order."""
    statuses = [E.RESULT_UNKNOWN] * 40 + [E.COMPLETED] * 900 + [E.FAILED] * 60
    ToolCall.objects.bulk_create(
        ToolCall(
            tenant=tenant,
            run=run,
            capability_id="refund-order-v2",
            intent=f"i{n}",
            object_ref="order:order-001",
            args={},
            args_digest="d" * 64,
            idempotency_key=f"key-{n}",
            external_request_id=f"req_{n}",
            execution_status=status,
        )
        for n, status in enumerate(statuses)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE toolcalls_toolcall")
    sql, params = desk._stuck_calls(tenant, timezone.now()).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (explained,) = cursor.fetchone()
    expected = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    assert expected["Plan Rows"] >= 20


def test_pending_approvals_are_counted_from_their_index_alone(tenant: Tenant) -> None:
    off = (*SCANS_OFF, "enable_indexscan")
    for read in (
        lambda: inbox_state(tenant=tenant),
        lambda: dashboard.approvals_by_age(tenant=tenant, now=timezone.now()),
    ):
        assert "Index Only Scan using approval_changed" in plan_of(
            read, "approvals_approval", off=off
        )


@pytest.mark.parametrize("before", [False, True])
def test_a_persons_audit_page_reads_their_newest_events_in_order(
    tenant: Tenant, run: Run, sandbox: Sandbox, before: bool
) -> None:
    # The events' statistics are this test's own: what earlier tests left in pg_class and
    # pg_statistic (ANALYZE writes pg_class in place, past their rollback; autovacuum saw
    # their committed rows) made the planner pick event_audit in one CI run, rows 2,650 bytes
    # wide. ANALYZE counts this transaction's own rows, and its statistics roll back with it.
    for n in range(10):
        propose_in(run, intent=f"intent-{n}", actor="user:alice" if n % 2 else "api_key:key_a")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_event")
    cursor = (timezone.now(), "run_x", 3) if before else None
    query = AuditQuery(person="alice", before=cursor)
    sql, params = audit_events(tenant=tenant, query=query)[:101].query.sql_with_params()
    shown = plan(sql, params)
    assert "event_person" in shown
    assert "Sort" not in shown


ACTORS = [
    "user:alice",
    "USER:Alice",
    "alice",
    "api_key:key_agent0001",
    "system:sweeper",
    "user:user:alice",
    "system:",
    "usr:alice",
    "api_key",
    "",
    "user:ünïcode",
]


def test_the_person_of_an_actor_is_the_same_in_sql_and_python(tenant: Tenant) -> None:
    for actor in ACTORS:
        in_sql = (
            Tenant.objects.filter(pk=tenant.pk)
            .annotate(actor=Value(actor))
            .annotate(person=ActorPerson("actor"))
            .values_list("person", flat=True)
            .get()
        )
        assert in_sql == person_of(actor), actor
