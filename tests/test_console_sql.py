"""console/sql.py reads exactly what the ORM reads for the dashboard's panels: the same
pending approvals per age, the same events per hour, and nothing of another tenant."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from approvals.models import Approval
from console import dashboard, sql
from runs import events
from runs import services as run_services
from runs.models import Event, Run, Tenant
from tests.helpers import BIG_REFUND, REFUND, propose_in
from tests.sandbox_process import Sandbox

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="console/sql.py is PostgreSQL's"
)


def test_pending_approvals_by_age_read_what_the_orm_reads(
    tenant: Tenant, other_tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    now = timezone.now()
    ages = [timedelta(minutes=1), timedelta(minutes=30), timedelta(hours=5), timedelta(days=2)]
    for n, age in enumerate(ages):
        call = propose_in(run, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"i{n}")
        Approval.objects.filter(tool_call=call).update(created_at=now - age)
    # Not pending, and another tenant's: neither is counted.
    Approval.objects.filter(created_at=now - ages[0]).update(state=Approval.State.EXPIRED)
    theirs = propose_in(run, {**BIG_REFUND, "amount_cents": 20_900}, intent="theirs")
    Approval.objects.filter(tool_call=theirs).update(tenant=other_tenant)
    moments = [now - timedelta(seconds=bound) for bound in dashboard.APPROVAL_AGE_BUCKETS]

    read = sql.pending_approvals_newer_than(tenant_id=tenant.pk, moments=moments)

    assert read == dashboard.pending_approvals_newer_than_orm(tenant=tenant, moments=moments)
    assert read == (3, [0, 1, 1, 2])


def test_events_per_hour_read_what_the_orm_reads(
    tenant: Tenant, other_tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    propose_in(run, REFUND, intent="now")
    proposed = Event.objects.get(run=run, event_type="tool_call.proposed")
    now = timezone.now()
    other, _ = run_services.run_start(tenant=other_tenant, title="other", actor="t")
    with transaction.atomic():
        for hours_ago in (1, 1, 3, 30):
            events.append(
                run=run,
                event_type="tool_call.proposed",
                payload=proposed.payload,
                producer="api",
                occurred_at=now - timedelta(hours=hours_ago, minutes=5),
            )
        events.append(
            run=other, event_type="tool_call.proposed", payload=proposed.payload, producer="api"
        )
    since = now - timedelta(hours=24)
    types = [event_type for event_type, _ in dashboard.TREND_SERIES]

    read = sql.events_per_hour(tenant_id=tenant.pk, event_types=types, since=since)

    orm = dashboard.events_per_hour_orm(tenant=tenant, event_types=types, since=since)
    assert sorted(read) == sorted(orm)
    assert sorted(n for event_type, _, n in read if event_type == "tool_call.proposed") in (
        [1, 1, 2],  # the first call's hour, 1 h ago (twice), 3 h ago
        [1, 3],  # the first call at the hour's start, in the same hour as the two
    )
