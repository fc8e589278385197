"""A dispatch batch's written-out statements (toolcalls/sql_batch.py) read and write what the
ORM's queries did: the messages marked done, the tenant's active webhooks, the authorized
calls waiting for others."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import transaction

from runs import outbox
from runs.models import OutboxMessage, Run, Tenant
from toolcalls import sql_batch
from toolcalls.models import ToolCall
from toolcalls.webhook_models import Webhook

pytestmark = pytest.mark.django_db

AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
EARLIER = datetime(2025, 12, 31, 23, 0, tzinfo=UTC)


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_marking_messages_done_writes_what_the_orms_update_writes(run: Run) -> None:
    messages = [outbox.enqueue("toolcalls.dispatch", f"tc_{n}") for n in range(4)]
    OutboxMessage.objects.filter(pk=messages[1].pk).update(done_at=EARLIER)  # done already
    marked = [m.pk for m in messages[:3]]  # the fourth is not asked
    rows = []
    for write in (
        lambda: sql_batch.mark_done(marked, AT),
        lambda: OutboxMessage.objects.filter(pk__in=marked, done_at=None).update(done_at=AT),
    ):
        with transaction.atomic():
            write()
            found = OutboxMessage.objects.filter(pk__in=[m.pk for m in messages]).order_by("pk")
            rows.append([_values(m) for m in found])
            transaction.set_rollback(True)

    assert rows[0] == rows[1]
    done_at = {row["id"]: row["done_at"] for row in rows[0]}
    assert [done_at[m.pk] for m in messages] == [AT, EARLIER, AT, None]


def test_the_active_webhooks_are_the_orms(tenant: Tenant, other_tenant: Tenant) -> None:
    def hook(owner: Tenant, n: int, **fields: Any) -> Webhook:
        fields = {"event_types": ["e", n], **fields}
        return Webhook.objects.create(tenant=owner, url=f"http://127.0.0.1:9/{n}", **fields)

    hook(tenant, 1)
    hook(tenant, 2, kind=Webhook.Kind.SLACK, event_types=[])
    hook(tenant, 3, active=False)
    hook(other_tenant, 4)

    ours = sorted(sql_batch.active_webhooks(tenant.pk), key=lambda h: h.pk)
    theirs = list(Webhook.objects.filter(tenant_id=tenant.pk, active=True).order_by("pk"))
    assert [_values(h) for h in ours] == [_values(h) for h in theirs]
    assert len(ours) == 2 and all(h._state.db == "default" and not h._state.adding for h in ours)
    assert sql_batch.active_webhooks(tenant.pk + 1000) == []


def _call(run: Run, n: int, status: str = "authorized") -> ToolCall:
    call = ToolCall.objects.create(
        tenant=run.tenant,
        run=run,
        capability_id="refund-order-v2",
        intent=f"i{n}",
        object_ref=f"order:o-{n}",
        args={},
        args_digest="d" * 64,
        idempotency_key=f"key-{n}",
        external_request_id=f"req_{n}",
    )
    # Protected state field: a queryset update puts the call where the test needs it.
    ToolCall.objects.filter(pk=call.pk).update(execution_status=status)
    return call


def test_the_calls_waiting_are_the_orms(run: Run) -> None:
    first, second, other = _call(run, 1, "completed"), _call(run, 2, "completed"), _call(run, 3)
    both = _call(run, 4)  # waits for first and second: named once
    both.depends_on.set([first, second])
    dispatching = _call(run, 5, "dispatching")  # not authorized
    dispatching.depends_on.set([first])
    elsewhere = _call(run, 6)  # waits for a call not asked about
    elsewhere.depends_on.set([other])
    one = _call(run, 7)
    one.depends_on.set([second])

    asked = [first.pk, second.pk]
    waiting = ToolCall.objects.filter(depends_on__in=asked, execution_status="authorized")
    theirs = list(dict.fromkeys(waiting.order_by("pk").values_list("pk", flat=True)))
    assert sql_batch.authorized_waiting_for(asked) == theirs == sorted([both.pk, one.pk])
    assert sql_batch.authorized_waiting_for([dispatching.pk]) == []
