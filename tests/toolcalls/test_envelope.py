"""The result envelope of every tool-call answer: status, result, executed_args, edited,
decision, approval_url, expires_at, retry_after_s."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from runs.models import Event, User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls.models import AgentStatus, E, ToolCall, V

ENVELOPE = {
    "status",
    "result",
    "executed_args",
    "edited",
    "decision",
    "approval_url",
    "expires_at",
    "retry_after_s",
}


def read(agent: ApiClient, call: dict) -> dict:
    return agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}").json()


def test_a_call_awaiting_approval_says_where_and_until_when(
    agent: ApiClient, sandbox: Sandbox, settings
) -> None:
    settings.COUNTERSIGN_BASE_URL = "https://countersign.example.com/"
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    assert set(call) >= ENVELOPE
    assert call["status"] == "awaiting_approval"
    assert call["approval_url"] == f"https://countersign.example.com/approvals/{approval.pk}/"
    # The API writes times to the millisecond.
    expires_at = datetime.fromisoformat(call["expires_at"])
    assert abs(expires_at - approval.expires_at) < timedelta(milliseconds=1)
    assert call["retry_after_s"] == 5
    assert (call["decision"], call["edited"], call["result"]) == (None, False, None)
    assert call["executed_args"] == BIG_REFUND


def test_an_edited_approval_reports_what_ran_and_who_decided(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approver.email = "alice@acme.example"
    approver.save()
    call = propose(agent, BIG_REFUND)
    decide(
        logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000", reason="half"
    )
    run_due()
    response = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}")
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["executed_args"] == {**BIG_REFUND, "amount_cents": 15000}
    assert body["edited"] is True
    assert body["result"]["amount_cents"] == 15000
    assert body["result"]["refund_id"] == body["external_id"]
    # Our own plumbing, echoed by the system, is not part of the business result.
    assert {"idempotency_key", "request_id"} & set(body["result"]) == set()
    assert body["raw_result"]["idempotency_key"] == body["idempotency_key"]
    decision = body["decision"]
    assert (decision["outcome"], decision["by"], decision["reason"]) == (
        "approved",
        ["alice"],
        "half",
    )
    (entry,) = decision["decisions"]
    assert entry["changes"] == {"amount_cents": {"from": 25000, "to": 15000}}
    assert (body["expires_at"], body["retry_after_s"]) == (None, None)
    assert "alice@acme.example" not in response.content.decode()
    # What the agent asked for stays in the log.
    proposed = Event.objects.get(tool_call_id=call["tool_call_id"], event_type="tool_call.proposed")
    assert proposed.payload["args"] == BIG_REFUND


def test_a_rejection_says_who_and_why(agent: ApiClient, approver: User, sandbox: Sandbox) -> None:
    call = propose(agent, BIG_REFUND)
    decide(logged_in(approver), approval_of(call), "reject", reason="not eligible")
    body = read(agent, call)
    assert body["status"] == "rejected"
    assert body["decision"]["outcome"] == "rejected"
    assert (body["decision"]["by"], body["decision"]["reason"]) == (["alice"], "not eligible")
    assert (body["edited"], body["retry_after_s"], body["expires_at"]) == (False, None, None)


def test_a_quorum_not_reached_is_pending_with_who_approved(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, {**BIG_REFUND, "amount_cents": 120000})
    decide(logged_in(approver), approval_of(call), "approve")
    body = read(agent, call)
    assert body["status"] == "awaiting_approval"
    assert (body["decision"]["outcome"], body["decision"]["by"]) == ("pending", ["alice"])
    assert body["approval"]["approvals"] == 1


def test_a_call_without_approval_runs_then_succeeds(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent, {**BIG_REFUND, "amount_cents": 1500})
    assert (call["status"], call["retry_after_s"], call["approval_url"]) == ("running", 1, None)
    run_due()
    body = read(agent, call)
    assert body["status"] == "succeeded"
    assert body["result"]["status"] == "succeeded"


@pytest.mark.parametrize(
    ("execution", "verification", "status"),
    [
        (E.PROPOSED, V.NOT_OBSERVED, "running"),
        (E.AWAITING_APPROVAL, V.NOT_OBSERVED, "awaiting_approval"),
        (E.AUTHORIZED, V.NOT_OBSERVED, "running"),
        (E.DISPATCHING, V.NOT_OBSERVED, "running"),
        (E.ACCEPTED, V.PENDING, "running"),
        (E.COMPLETED, V.PENDING, "running"),
        (E.COMPLETED, V.CONFIRMED_SUCCESS, "succeeded"),
        (E.COMPLETED, V.CONFIRMED_FAILURE, "failed"),
        (E.COMPLETED, V.INCONCLUSIVE, "unknown"),
        (E.FAILED, V.NOT_OBSERVED, "failed"),
        (E.RESULT_UNKNOWN, V.NOT_OBSERVED, "unknown"),
        (E.NEEDS_HUMAN, V.NOT_OBSERVED, "unknown"),
        (E.REJECTED, V.NOT_OBSERVED, "rejected"),
        (E.EXPIRED, V.NOT_OBSERVED, "expired"),
        (E.INVALIDATED, V.NOT_OBSERVED, "cancelled"),
        (E.CANCELLED, V.NOT_OBSERVED, "cancelled"),
        (E.COMPENSATING, V.CONFIRMED_SUCCESS, "succeeded"),
        (E.COMPENSATED, V.CONFIRMED_SUCCESS, "succeeded"),
    ],
)
def test_one_word_to_act_on(execution: str, verification: str, status: str) -> None:
    call = ToolCall(execution_status=execution, verification_status=verification)
    assert call.agent_status == status


def test_every_pair_of_states_has_a_status() -> None:
    for execution in E.values:
        for verification in V.values:
            call = ToolCall(execution_status=execution, verification_status=verification)
            assert call.agent_status in AgentStatus.values


def test_the_openapi_document_describes_the_envelope(client) -> None:
    document = client.get("/api/v1/openapi.json").json()
    schema = document["components"]["schemas"]["ToolCallOut"]
    assert set(schema["properties"]) >= ENVELOPE
    assert set(schema["required"]) >= ENVELOPE
    assert {"/api/v1/policy/evaluate", "/api/v1/tool-calls/{tool_call_id}/cancel"} <= set(
        document["paths"]
    )
    status = json.dumps(document["components"]["schemas"]["AgentStatus"])
    for word in AgentStatus.values:
        assert word in status
