"""The record step writes each call once and a batch's other writes once per kind
(toolcalls/record.py): one UPDATE per call per transaction, one statement each for the
attempts' ends, receipts, object revisions and verification messages of a whole batch — with
one event per transition still, in the same transaction."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from runs import services as run_services
from runs import transitions
from runs.models import Event, Run
from tests.helpers import BIG_REFUND, REFUND, fresh, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch, dispatch_batch
from toolcalls.models import ObjectRevision, ToolCall
from toolcalls.writes import tool_call_transition

pytestmark = pytest.mark.django_db


def statements(queries: CaptureQueriesContext) -> Counter[str]:
    """How many INSERTs and UPDATEs each table got."""
    found = Counter()
    for query in queries.captured_queries:
        match = re.match(r'\s*(INSERT INTO|UPDATE) "?(\w+)"?', query["sql"])
        if match:
            found[f"{match[1].split()[0]} {match[2]}"] += 1
    return found


def test_a_record_saves_the_call_once_with_one_event_per_transition(
    run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)
    claim = dispatch.tool_call_claim(tool_call_id=call.pk, outbox_id=None)
    outcome = dispatch.send(claim)

    with CaptureQueriesContext(connection) as queries:
        dispatch.record_outcome(claim, outcome)

    assert statements(queries)["UPDATE toolcalls_toolcall"] == 1
    recorded = Event.objects.filter(tool_call_id=call.pk).order_by("seq")
    types = list(recorded.values_list("event_type", flat=True))
    assert types[-3:] == [
        "tool_call.accepted",
        "tool_call.completed",
        "tool_call.verification_pending",
    ]
    call = fresh(call)
    assert (call.execution_status, call.verification_status) == ("completed", "pending")
    assert call.lease_expires_at is None and call.external_id and call.result
    assert call.status_since == recorded.get(event_type="tool_call.completed").occurred_at


def test_a_batch_records_with_one_statement_of_each_kind(run: Run, sandbox: Sandbox) -> None:
    other, _ = run_services.run_start(tenant=run.tenant, title="other", actor="test")
    calls = [
        propose_in(r, {**REFUND, "amount_cents": 100 + i}, intent=f"b-{i}")
        for i, r in enumerate([run, run, other, other])
    ]
    claims = dispatch_batch.claim_batch([(c.pk, None) for c in calls])
    outcomes = dispatch_batch.send_batch(claims)

    with CaptureQueriesContext(connection) as queries:
        accepted = dispatch_batch.record_batch(list(zip(claims, outcomes, strict=True)))

    assert len(accepted) == 4
    assert statements(queries) == {
        "UPDATE toolcalls_toolcall": 1,  # the four calls together, not one per transition
        "UPDATE toolcalls_attempt": 1,
        "INSERT toolcalls_receipt": 1,
        "UPDATE toolcalls_objectrevision": 1,
        "INSERT runs_outboxmessage": 1,
        "INSERT runs_event": 1,
    }
    for call in calls:
        call = fresh(call)
        assert call.verification_status == "pending"
        assert call.receipts.get().attempt.classification == "confirmed"


def test_a_write_recorded_in_a_batch_invalidates_approvals_of_the_old_revision(
    run: Run, sandbox: Sandbox
) -> None:
    writer = propose_in(run, {**REFUND, "order_id": "order-003", "amount_cents": 100})
    held = propose_in(run, BIG_REFUND, intent="held", object_revision=1)
    assert held.execution_status == "awaiting_approval"
    other = propose_in(run, {**REFUND, "amount_cents": 101}, intent="other")

    dispatch_batch.tool_calls_dispatch_batch([(writer.pk, None), (other.pk, None)])

    assert ObjectRevision.objects.get(ref="order:order-003").revision == 2
    assert fresh(held).execution_status == "invalidated"
    assert Approval.objects.get(tool_call=held).state == "invalidated"
    assert fresh(writer).verification_status == "confirmed_success"


def test_a_row_saved_once_keeps_every_column_its_transitions_changed(
    run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)
    with transaction.atomic():
        locked = ToolCall.objects.select_for_update().get(pk=call.pk)
        with CaptureQueriesContext(connection) as queries, transitions.saved_once(locked):
            locked.last_error_name = "tool.test"
            tool_call_transition(locked, "cancel", actor="t", producer="test")
            assert fresh(call).execution_status == "authorized"  # not saved yet
    assert statements(queries)["UPDATE toolcalls_toolcall"] == 1
    saved = fresh(call)
    assert (saved.execution_status, saved.last_error_name) == ("cancelled", "tool.test")


def test_a_block_that_raises_saves_nothing(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    with pytest.raises(RuntimeError), transaction.atomic():
        locked = ToolCall.objects.select_for_update().get(pk=call.pk)
        with CaptureQueriesContext(connection) as queries, transitions.saved_once(locked):
            tool_call_transition(locked, "cancel", actor="t", producer="test")
            raise RuntimeError("a bug after the transition")
    assert statements(queries)["UPDATE toolcalls_toolcall"] == 0
    assert fresh(call).execution_status == "authorized"
