"""The desk's rows read by console/sql.py are exactly what the ORM reads (console/desk.py
`desk_calls_orm`, `desk_runs_orm`): the same stuck calls in the same order, with their runs and
owners, the same runs needing a person, the same counts, and nothing of another tenant; and a
desk item's call with its run, tenant and decision as select_related reads them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console import desk, sql
from runs.models import Decision, Run, Tenant, User
from runs.services import run_start, run_transition
from toolcalls.models import E, ToolCall

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="console/sql.py is PostgreSQL's"
)


def _call(run: Run, name: str, status: str, since: datetime, **fields) -> ToolCall:
    fields.setdefault("capability_id", "refund-order-v2")
    fields.setdefault("args", {})
    return ToolCall(
        id=f"tc_{name}",
        tenant_id=run.tenant_id,
        run=run,
        intent=name,
        object_ref="order:order-001",
        args_digest="d" * 64,
        idempotency_key=f"key-{name}",
        external_request_id=f"req_{name}",
        execution_status=status,
        status_since=since,
        **fields,
    )


def _handed_to_a_person(tenant: Tenant, title: str) -> Run:
    run, _ = run_start(tenant=tenant, title=title, actor="t")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        run_transition(locked, "hand_to_human", actor="t", producer="t", reason="expired")
    return run


def test_the_desk_reads_what_the_orm_reads(
    tenant: Tenant, other_tenant: Tenant, run: Run, admin_user: User, bob: User
) -> None:
    now = timezone.now()
    hour = timedelta(hours=1)
    theirs, _ = run_start(tenant=other_tenant, title="theirs", actor="t")
    Run.objects.filter(pk=run.pk).update(title='Refund <b>"order"</b>')
    ToolCall.objects.bulk_create(
        [
            _call(run, "a", E.RESULT_UNKNOWN, now - 3 * hour, last_error_name="tool.timeout"),
            # Two at the same moment: by id, as the index orders them.
            _call(run, "c", E.NEEDS_HUMAN, now - 2 * hour, desk_owner=bob, capability_id="x-v1"),
            _call(run, "b", E.RESULT_UNKNOWN, now - 2 * hour, desk_owner=admin_user),
            _call(run, "d", E.DISPATCHING, now - 4 * hour, lease_expires_at=now - hour),
            # Its worker still holds the lease, it is settled, or it is another tenant's.
            _call(run, "e", E.DISPATCHING, now - 5 * hour, lease_expires_at=now + hour),
            _call(run, "f", E.COMPLETED, now - 6 * hour),
            _call(theirs, "g", E.RESULT_UNKNOWN, now - 7 * hour),
        ]
    )
    waiting = _handed_to_a_person(tenant, "expired approval")
    silent, _ = run_start(tenant=tenant, title="handed over without an event", actor="t")
    Run.objects.filter(pk=silent.pk).update(state=Run.State.NEEDS_HUMAN)
    # Its calls are on the desk (they show it), or it is another tenant's.
    Run.objects.filter(pk=run.pk).update(state=Run.State.NEEDS_HUMAN)
    _handed_to_a_person(other_tenant, "their expired approval")

    for limit in (100, 2):
        calls = sql.desk_calls(tenant_id=tenant.pk, now=now, limit=limit)
        assert calls == desk.desk_calls_orm(tenant=tenant, now=now, limit=limit)
        runs = sql.desk_runs(tenant_id=tenant.pk, now=now, limit=limit)
        assert runs == desk.desk_runs_orm(tenant=tenant, now=now, limit=limit)

    calls = sql.desk_calls(tenant_id=tenant.pk, now=now, limit=100)
    assert [(row[4], row[0]) for row in calls] == [
        ("tc_d", "lease_expired"),
        ("tc_a", "result_unknown"),
        ("tc_b", "result_unknown"),
        ("tc_c", "needs_human"),
    ]
    assert calls[2] == (
        "result_unknown",
        now - 2 * hour,
        run.pk,
        'Refund <b>"order"</b>',
        "tc_b",
        "refund-order-v2",
        E.RESULT_UNKNOWN,
        "",
        admin_user.pk,
        admin_user.username,
    )
    assert calls[3][-2:] == (bob.pk, "bob") and calls[0][-2:] == (None, None)
    runs = sql.desk_runs(tenant_id=tenant.pk, now=now, limit=100)
    assert [(run_id, title) for run_id, title, _ in runs] == [
        (waiting.pk, "expired approval"),
        (silent.pk, "handed over without an event"),
    ]
    assert runs[0][2] is not None and runs[1][2] is None

    by_capability = sql.desk_calls_by_capability(tenant_id=tenant.pk, now=now)
    assert sorted(by_capability) == sorted(
        desk.desk_calls_by_capability_orm(tenant=tenant, now=now)
    )
    assert sorted(by_capability) == [("refund-order-v2", 3), ("x-v1", 1)]
    counted = sql.desk_runs_count(tenant_id=tenant.pk, now=now)
    assert counted == desk._runs_needing_a_person(tenant, now).count() == 2


def test_the_desk_lists_calls_then_runs_by_how_long_they_waited(tenant: Tenant, run: Run) -> None:
    now = timezone.now()
    waiting = _handed_to_a_person(tenant, "expired approval")
    silent, _ = run_start(tenant=tenant, title="handed over without an event", actor="t")
    Run.objects.filter(pk=silent.pk).update(state=Run.State.NEEDS_HUMAN)
    ToolCall.objects.bulk_create(
        [
            _call(run, "old", E.RESULT_UNKNOWN, now - timedelta(days=1)),
            _call(run, "new", E.RESULT_UNKNOWN, now + timedelta(minutes=1)),
        ]
    )

    items = desk.desk_items(tenant=tenant, limit=100)

    assert [(item.kind, item.call_id or item.run_id) for item in items] == [
        ("result_unknown", "tc_old"),
        ("run_needs_human", waiting.pk),
        ("run_needs_human", silent.pk),  # no event: it waits since now
        ("result_unknown", "tc_new"),
    ]
    assert items[2].since >= now and items[2].run_title == "handed over without an event"
    assert [item.call_id for item in desk.desk_items(tenant=tenant, limit=1)] == ["tc_old"]


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _orm(tenant: Tenant, tool_call_id: str) -> ToolCall | None:
    query = ToolCall.objects.select_related("run", "decision", "tenant")
    return query.filter(tenant=tenant, pk=tool_call_id).first()


def test_a_desk_item_reads_its_call_as_the_orm_reads_it(
    tenant: Tenant, other_tenant: Tenant, run: Run
) -> None:
    now = timezone.now()
    decision = Decision.objects.create(run=run, kind="refund", content={"why": "late <b>"})
    ToolCall.objects.bulk_create(
        [
            _call(run, "decided", E.RESULT_UNKNOWN, now, decision=decision, args={"a": [1]}),
            _call(run, "undecided", E.NEEDS_HUMAN, now),
        ]
    )

    for name in ("tc_decided", "tc_undecided"):
        with CaptureQueriesContext(connection) as queries:
            read = sql.desk_call(tenant_id=tenant.pk, tool_call_id=name)
            related = (read.run, read.tenant, read.decision)  # no further query
        orm = _orm(tenant, name)
        assert len(queries) == 1
        assert _values(read) == _values(orm)
        assert _values(related[0]) == _values(orm.run)
        assert _values(related[1]) == _values(orm.tenant)
        assert (related[2] and _values(related[2])) == (orm.decision and _values(orm.decision))
    assert sql.desk_call(tenant_id=tenant.pk, tool_call_id="tc_decided").args == {"a": [1]}
    assert sql.desk_call(tenant_id=tenant.pk, tool_call_id="tc_decided").decision.content == {
        "why": "late <b>"
    }
    assert sql.desk_call(tenant_id=tenant.pk, tool_call_id="tc_undecided").decision is None
    # Another tenant's call, and no call at all.
    assert sql.desk_call(tenant_id=other_tenant.pk, tool_call_id="tc_decided") is None
    assert sql.desk_call(tenant_id=tenant.pk, tool_call_id="tc_missing") is None
