"""POST /api/v1/tool-calls/{id}/cancel: before dispatch the call and its approval are
cancelled; after dispatch, 409 naming the state."""

from __future__ import annotations

from django.core.management import call_command

from approvals.models import Approval
from runs.models import Event, Run, User
from tests.helpers import BIG_REFUND, REFUND, ApiClient, approval_of, decide, logged_in, propose
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due


def cancel(agent: ApiClient, call: dict, status: int = 200, **body) -> dict:
    response = agent.post(f"/api/v1/tool-calls/{call['tool_call_id']}/cancel", body)
    assert response.status_code == status, response.json()
    return response.json()


def test_a_call_awaiting_approval_is_cancelled_with_its_approval(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    assert Run.objects.get(pk=call["run_id"]).state == "waiting"
    body = cancel(agent, call, reason="the customer withdrew")
    assert (body["status"], body["execution_status"]) == ("cancelled", "cancelled")
    assert approval_of(call).state == Approval.State.CANCELLED
    assert Run.objects.get(pk=call["run_id"]).state == "active"  # nothing left to wait for
    types = set(Event.objects.filter(tool_call_id=call["tool_call_id"]).values_list("event_type"))
    assert {("tool_call.cancelled",), ("approval.cancelled",)} <= types
    # A late decision on the page finds it cancelled.
    response = decide(logged_in(approver), approval_of(call), "approve")
    assert response.status_code == 409
    call_command("rebuild_projections", "--verify")


def test_an_authorized_call_is_cancelled_and_never_sent(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent, REFUND)
    assert call["execution_status"] == "authorized"
    assert cancel(agent, call)["status"] == "cancelled"
    run_due()
    assert sandbox.ledger("payments") == []


def test_cancelling_twice_answers_the_same(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent, BIG_REFUND)
    first = cancel(agent, call)
    again = cancel(agent, call)
    assert again["updated_at"] == first["updated_at"]
    assert Event.objects.filter(event_type="tool_call.cancelled").count() == 1


def test_a_dispatched_call_is_not_cancelled(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent, REFUND)
    run_due()
    error = cancel(agent, call, status=409)["error"]
    assert error["name"] == "tool_call.already_dispatched"
    assert "completed" in error["message"]
    assert error["details"] == [{"execution_status": "completed", "status": "succeeded"}]
    assert len(sandbox.ledger("payments")) == 1


def test_a_rejected_call_has_nothing_to_cancel(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    decide(logged_in(approver), approval_of(call), "reject", reason="no")
    error = cancel(agent, call, status=409)["error"]
    assert error["name"] == "tool_call.invalid_state"
    assert "rejected" in error["message"]


def test_another_tenants_call_is_not_found(
    agent: ApiClient, other_agent: ApiClient, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    assert cancel(other_agent, call, status=404)["error"]["name"] == "resource.not_found"
    assert approval_of(call).state == Approval.State.PENDING
