"""An event's tenant has no database FOREIGN KEY (runs/models.py says why): what it guarded
is still held — every event carries its run's tenant, an event for a missing run is refused,
and a tenant that events point at cannot be deleted."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from runs import events, services, sql
from runs.models import Event, Run, Tenant
from toolcalls.lifecycle import run_stop

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="foreign keys as PostgreSQL checks them"
)
# A transition's event, written here without the transition: what it says does not matter.
NOTE = {"from": "active", "to": "waiting"}


def _foreign_keys_to(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f'"
            " AND conrelid = 'runs_event'::regclass AND confrelid = %s::regclass",
            [table],
        )
        return cursor.fetchone()[0]


def test_an_event_row_is_checked_against_its_run_only(db: None) -> None:
    # Each key is a deferred trigger per event row, run at commit: the tenant's was redundant.
    assert _foreign_keys_to("runs_tenant") == 0
    assert _foreign_keys_to("runs_run") == 1


def test_every_event_carries_its_runs_tenant(
    run: Run, tenant: Tenant, other_tenant: Tenant
) -> None:
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="eligibility", content={"ok": True}, actor="test"
    )
    other, _ = services.run_start(tenant=other_tenant, title="theirs", actor="test")
    with transaction.atomic(), events.batch():
        for each in (run, other):
            events.append(run=each, event_type="run.waiting", payload=NOTE, producer="test")
    run_stop(tenant=tenant, run_id=run.pk, actor="test", reason="done")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE e.tenant_id <> r.tenant_id)"
            " FROM runs_event e JOIN runs_run r ON r.id = e.run_id"
        )
        written, astray = cursor.fetchone()
    assert written >= 5
    assert astray == 0


def _event(run_id: str, tenant_id: int) -> Event:
    now = timezone.now()
    return Event(
        run_id=run_id, seq=1, event_type="run.waiting", schema_version=1, producer="test",
        tenant_id=tenant_id, occurred_at=now, recorded_at=now, payload=NOTE,
        prev_hash=events.GENESIS_HASH, hash="f" * 64,
    )  # fmt: skip


def test_an_event_for_a_missing_run_is_refused(tenant: Tenant) -> None:
    missing = Run(pk="run_missing", tenant=tenant)
    with pytest.raises(Run.DoesNotExist), transaction.atomic():
        events.append(run=missing, event_type="run.waiting", payload=NOTE, producer="test")
    # Behind append's back too: the run's key is still checked by the database.
    with pytest.raises(IntegrityError), transaction.atomic():
        connection.cursor().execute("SET CONSTRAINTS ALL IMMEDIATE")
        sql.insert_events([_event("run_missing", tenant.pk)])


def test_a_tenant_with_events_cannot_be_deleted(run: Run, tenant: Tenant) -> None:
    run_stop(tenant=tenant, run_id=run.pk, actor="test")
    assert Event.objects.filter(tenant=tenant).exists()
    with pytest.raises(ProtectedError):
        tenant.delete()
    # And by the database, behind Django's back: each event's run points at the tenant.
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("DELETE FROM runs_tenant WHERE id = %s", [tenant.pk])
