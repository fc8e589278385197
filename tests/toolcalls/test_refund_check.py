"""What is still refundable counts our own refunds of the order that are not final yet: at
proposal, at an edit and when an approver approves (issue #10, point 7). order-002 has 35000
cents captured and nothing refunded in the seeded sandbox."""

from __future__ import annotations

from django.core.management import call_command

from runs.models import User
from tests.helpers import (
    ApiClient,
    approval_of,
    decide,
    logged_in,
    propose,
    start_run,
    tool_call_of,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch


def refund(cents: int, order_id: str = "order-002") -> dict:
    return {"order_id": order_id, "amount_cents": cents, "currency": "USD"}


def test_a_second_refund_beyond_what_the_first_leaves_is_refused(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    first = propose(agent, refund(25000), run_id=run_id, intent="first")
    assert first["execution_status"] == "awaiting_approval"
    refused = propose(agent, refund(15000), run_id=run_id, intent="second", status=422)
    assert refused["error"]["name"] == "tool.validation_failed"
    (detail,) = refused["error"]["details"]
    assert detail["field"] == "args.amount_cents"
    assert "At most 10000 cents of this order can still be refunded" in detail["problem"]
    assert f"{first['tool_call_id']} (25000 cents, awaiting_approval)" in detail["problem"]
    # What is left is still refundable.
    assert propose(agent, refund(10000), run_id=run_id, intent="third")["tool_call_id"]
    assert sandbox.ledger() == []


def test_a_refund_the_payment_system_shows_is_not_counted_twice(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    done = propose(agent, refund(5000), run_id=run_id, intent="done")
    run_due()
    assert tool_call_of(done).verification_status == "confirmed_success"
    assert sandbox.order("order-002")["refundable_cents"] == 30000
    assert propose(agent, refund(30000), run_id=run_id, intent="rest")["tool_call_id"]


def test_an_unknown_refund_the_payment_system_shows_is_not_counted_twice(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    lost = propose(agent, refund(5000), intent="lost")
    dispatch.tool_call_dispatch(tool_call_id=lost["tool_call_id"])
    assert tool_call_of(lost).execution_status == "result_unknown"
    assert sandbox.order("order-002")["refundable_cents"] == 30000  # it did land
    refused = propose(agent, refund(30001), intent="too-much", status=422)
    assert lost["tool_call_id"] not in refused["error"]["details"][0]["problem"]
    assert propose(agent, refund(30000), intent="rest")["tool_call_id"]


def test_the_approval_page_lists_the_other_refunds_of_the_order(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    big = propose(agent, refund(25000), run_id=run_id, intent="big")
    small = propose(agent, refund(5000), run_id=run_id, intent="small")
    assert small["execution_status"] == "authorized"  # under $200: nobody is asked
    page = logged_in(approver).get(f"/approvals/{approval_of(big).pk}/").content.decode()
    assert "Other refunds of this order" in page
    listed = page[page.index('id="other-calls"') :]
    assert small["tool_call_id"] in listed
    assert "Amount $50.00" in listed
    assert "authorized" in listed
    assert big["tool_call_id"] not in listed


def test_an_approver_cannot_approve_a_refund_that_would_fail_now(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    """Two refunds of order-003 (150000 cents captured) over $200 each fitted when proposed;
    then 11000 cents went out at the payment system itself. Approving the second now is
    refused, saying why, and nothing is written."""
    run_id = start_run(agent)
    first = propose(agent, refund(80000, "order-003"), run_id=run_id, intent="first")
    second = propose(agent, refund(60000, "order-003"), run_id=run_id, intent="second")
    by_hand = sandbox.post("payments", "/refunds", refund(11000, "order-003"), request_id="req-x")
    assert by_hand.status_code == 201, by_hand.text
    approval = approval_of(second)
    alice = logged_in(approver)
    response = decide(alice, approval, "approve")
    assert response.status_code == 409
    page = response.content.decode()
    assert "approval.check_failed" in page
    assert "At most 59000 cents of this order can still be refunded" in page
    assert f"{first['tool_call_id']} (80000 cents, awaiting_approval)" in page
    approval.refresh_from_db()
    assert (approval.state, approval.decisions.count()) == ("pending", 0)
    assert tool_call_of(second).execution_status == "awaiting_approval"
    # Once the first is rejected, the second fits again.
    decide(alice, approval_of(first), "reject", reason="one refund is enough")
    assert decide(alice, approval, "approve").status_code == 302
    run_due()
    assert tool_call_of(second).verification_status == "confirmed_success"
    assert [e["payload"]["amount_cents"] for e in sandbox.ledger("payments")] == [11000, 60000]
    call_command("rebuild_projections", "--verify")


def test_an_edit_is_checked_without_counting_its_own_call(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, refund(25000))
    response = decide(logged_in(approver), approval_of(call), "edit", edit__amount_cents="35000")
    assert response.status_code == 302
    assert tool_call_of(call).args["amount_cents"] == 35000
