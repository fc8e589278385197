"""The other calls on an object (toolcalls/selectors.py calls_on_object: the approval page's
warning, the proposal's context) read by written-out SQL on PostgreSQL (toolcalls/sql.py) are
the ORM's rows (calls_on_object_orm), in the same order, as equal instances."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from runs.models import Run, Tenant
from toolcalls import selectors
from toolcalls.models import E, ToolCall

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="toolcalls/sql.py calls_on_object is PostgreSQL's"
)


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_it_reads_the_orms_rows(tenant: Tenant, other_tenant: Tenant, run: Run) -> None:
    now = timezone.now()
    rows = [
        # (id, capability, object, status, updated, created): a tie on created_at too.
        ("tc_a", "refund-order-v2", "order:1", E.AWAITING_APPROVAL, now - timedelta(days=3), 5),
        ("tc_b", "refund-order-v2", "order:1", E.COMPLETED, now - timedelta(days=2), 4),
        ("tc_c", "refund-order-v2", "order:1", E.COMPLETED, now - timedelta(hours=2), 3),
        ("tc_d", "send-email-v1", "order:1", E.DISPATCHING, now - timedelta(days=5), 3),
        ("tc_e", "refund-order-v2", "order:2", E.AUTHORIZED, now, 2),
        ("tc_f", "refund-order-v2", "order:1", E.FAILED, now - timedelta(minutes=1), 1),
    ]
    ToolCall.objects.bulk_create(
        ToolCall(
            id=call_id, tenant_id=run.tenant_id, run=run, capability_id=capability,
            intent=call_id, object_ref=ref, args={"n": [call_id]}, args_digest="d" * 64,
            idempotency_key=call_id, external_request_id=f"req_{call_id}",
            execution_status=status,
        )
        for call_id, capability, ref, status, _, _ in rows
    )  # fmt: skip
    for call_id, _, _, _, updated, hours in rows:
        created = now - timedelta(hours=hours)
        ToolCall.objects.filter(pk=call_id).update(updated_at=updated, created_at=created)
    since = now - timedelta(days=1)
    for capability, exclude, limit in (
        (None, None, 20),
        ("refund-order-v2", None, 20),
        ("refund-order-v2", "tc_a", 20),
        (None, "tc_d", 2),
    ):
        for tenant_of in (tenant, other_tenant):
            asked = dict(tenant=tenant_of, object_ref="order:1", since=since, limit=limit)
            ours = selectors.calls_on_object(**asked, capability_id=capability, exclude=exclude)
            theirs = selectors.calls_on_object_orm(
                **asked, capability_id=capability, exclude=exclude
            )
            assert [_values(c) for c in ours] == [_values(c) for c in theirs]
    shown = selectors.calls_on_object(
        tenant=tenant, object_ref="order:1", since=since, capability_id="refund-order-v2"
    )
    # Open (whenever changed) or changed in the last day; newest first, then the id.
    assert [call.pk for call in shown] == ["tc_f", "tc_c", "tc_a"]
    assert shown[0].args == {"n": ["tc_f"]}
    both = selectors.calls_on_object(tenant=tenant, object_ref="order:1", since=since)
    assert [call.pk for call in both] == ["tc_f", "tc_d", "tc_c", "tc_a"]
