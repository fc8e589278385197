"""Verification: what the external system shows after it accepted a call, judged apart from
the call's execution (toolcalls/verify.py). Each test sends the call in this thread, changes
what the sandbox shows, then runs the observations the verification task would run."""

from __future__ import annotations

from runs.models import Run
from tests.helpers import fresh, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch
from toolcalls.models import ToolCall
from toolcalls.verify import MAX_VERIFICATIONS, tool_call_verify


def sent_and_accepted(call: ToolCall) -> ToolCall:
    """Claim, send and record, stopping before the first observation."""
    claim = dispatch.tool_call_claim(tool_call_id=call.pk, outbox_id=None, worker="w")
    dispatch.record_outcome(claim, dispatch.send(claim))
    call = fresh(call)
    assert (call.execution_status, call.verification_status) == ("completed", "pending")
    return call


def test_a_refund_the_order_never_shows_is_inconclusive_after_the_last_look(
    run: Run, sandbox: Sandbox
) -> None:
    call = sent_and_accepted(propose_in(run))
    sandbox.reset()  # the payment system no longer shows the refund on the order
    for _ in range(MAX_VERIFICATIONS - 1):
        tool_call_verify(tool_call_id=call.pk)
    assert fresh(call).verification_status == "pending"  # not yet: it may still show up
    tool_call_verify(tool_call_id=call.pk)
    call = fresh(call)
    assert (call.verification_status, call.verifications) == ("inconclusive", MAX_VERIFICATIONS)
    assert call.execution_status == "completed"  # what the system answered still stands
    event = call.run.events.get(tool_call_id=call.pk, event_type="tool_call.inconclusive")
    assert event.payload["reason"] == f"inconclusive after {MAX_VERIFICATIONS} observations"
    tool_call_verify(tool_call_id=call.pk)  # a late message changes nothing
    assert fresh(call).verifications == MAX_VERIFICATIONS


def test_a_reservation_released_before_the_look_is_a_confirmed_failure(
    run: Run, sandbox: Sandbox
) -> None:
    reserve = propose_in(
        run,
        {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1, "order_id": "order-002"},
        capability="reserve-stock-v1",
    )
    reserve = sent_and_accepted(reserve)
    # Someone at the warehouse releases the stock before the verifier looks.
    released = sandbox.post("warehouse", f"/reservations/{reserve.external_id}/release")
    assert released.status_code == 200
    tool_call_verify(tool_call_id=reserve.pk)
    reserve = fresh(reserve)
    assert (reserve.execution_status, reserve.verification_status) == (
        "completed",
        "confirmed_failure",
    )
    assert reserve.verifications == 1
    assert reserve.run.events.filter(event_type="tool_call.confirmed_failure").count() == 1
