"""A batch's verifications (dispatch_batch.verify_batch): their messages are marked done in
one statement and the calls waiting for the confirmed ones are woken with one query, as each
single verification would have woken them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import OutboxMessage, Run
from tests.helpers import REFUND, fresh, propose_in
from tests.sandbox_process import Sandbox
from tests.toolcalls.test_record_writes import statements
from toolcalls import dispatch, dispatch_batch, webhooks
from toolcalls.models import Webhook, WebhookDelivery
from toolcalls.writes import DISPATCH_TASK

pytestmark = pytest.mark.django_db


def test_a_batch_wakes_the_calls_waiting_for_it_and_marks_its_messages_once(
    run: Run, sandbox: Sandbox
) -> None:
    calls = [
        propose_in(run, {**REFUND, "amount_cents": 100 + i}, intent=f"v-{i}") for i in range(3)
    ]
    waiting = propose_in(
        run, {**REFUND, "amount_cents": 99}, intent="waiting", depends_on=[calls[0].pk]
    )
    dispatch.tool_call_dispatch(tool_call_id=waiting.pk)  # its dependency is not confirmed
    assert fresh(waiting).execution_status == "authorized"
    undone = OutboxMessage.objects.filter(task=DISPATCH_TASK, args__0=waiting.pk, done_at=None)
    undone.update(done_at="2026-01-01T00:00:00Z")  # the message that asked: done

    claims = dispatch_batch.claim_batch([(c.pk, None) for c in calls])
    outcomes = dispatch_batch.send_batch(claims)
    accepted = dispatch_batch.record_batch(list(zip(claims, outcomes, strict=True)))
    with CaptureQueriesContext(connection) as queries:
        dispatch_batch.verify_batch(accepted)

    assert all(fresh(c).verification_status == "confirmed_success" for c in calls)
    assert statements(queries)["UPDATE runs_outboxmessage"] == 1
    assert statements(queries)["UPDATE toolcalls_toolcall"] == 1  # the three calls together
    assert not OutboxMessage.objects.filter(pk__in=[m for _, m in accepted], done_at=None)
    assert undone.count() == 1  # woken: dispatched again now that its dependency is confirmed
    dispatch.tool_call_dispatch(tool_call_id=waiting.pk, outbox_id=undone.get().pk)
    assert fresh(waiting).verification_status == "confirmed_success"


def test_a_batch_reads_the_tenants_webhooks_once_and_reports_each_call(
    run: Run, sandbox: Sandbox
) -> None:
    hook = Webhook.objects.create(
        tenant=run.tenant, url="http://127.0.0.1:9/hook", event_types=["tool_call.terminal"]
    )
    calls = [
        propose_in(run, {**REFUND, "amount_cents": 100 + i}, intent=f"w-{i}") for i in range(3)
    ]
    claims = dispatch_batch.claim_batch([(c.pk, None) for c in calls])
    outcomes = dispatch_batch.send_batch(claims)
    accepted = dispatch_batch.record_batch(list(zip(claims, outcomes, strict=True)))
    with CaptureQueriesContext(connection) as queries:
        dispatch_batch.verify_batch(accepted)

    reads = [q for q in queries.captured_queries if "FROM toolcalls_webhook" in q["sql"]]
    assert len(reads) == 1  # one read for the tenant, not one per confirmed call
    deliveries = WebhookDelivery.objects.filter(webhook=hook, event_type="tool_call.terminal")
    assert sorted(deliveries.values_list("tool_call_id", flat=True)) == sorted(c.pk for c in calls)
    messages = OutboxMessage.objects.filter(task=webhooks.DELIVER_TASK)
    assert sorted(m.args[0] for m in messages) == sorted(d.pk for d in deliveries)
