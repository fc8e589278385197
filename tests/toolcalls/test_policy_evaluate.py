"""POST /api/v1/policy/evaluate: a dry run of the policy for a proposal, writing nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Approval, Policy
from runs.models import Event, OutboxMessage, Run, Tenant
from tests.helpers import BIG_REFUND, REFUND, ApiClient, propose
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

MODELS = [Policy, Run, ToolCall, Approval, Event, OutboxMessage]


def evaluate(agent: ApiClient, args: dict, capability: str = "refund-order-v2", status=200):
    response = agent.post("/api/v1/policy/evaluate", {"capability": capability, "args": args})
    assert response.status_code == status, response.json()
    return response.json()


def rows() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}


def test_a_small_refund_needs_nobody(agent: ApiClient) -> None:
    answer = evaluate(agent, REFUND)
    assert answer["needs_approval"] is False
    assert (answer["rule"], answer["required_approvers"], answer["expires_at"]) == (None, 0, None)
    assert answer["policy_version"] == 1


def test_a_refund_over_200_needs_one_approver_for_a_day(agent: ApiClient) -> None:
    answer = evaluate(agent, BIG_REFUND)
    assert answer["needs_approval"] is True
    assert (answer["rule"], answer["required_approvers"]) == ("refunds over $200", 1)
    assert (answer["risk"], answer["on_expiry"], answer["expiry_seconds"]) == (
        "high",
        "cancel",
        86400,
    )
    expected = timezone.now() + timedelta(days=1)
    assert abs(timezone.datetime.fromisoformat(answer["expires_at"]) - expected) < timedelta(
        seconds=5
    )
    assert "order-003" in answer["summary"]


def test_a_refund_over_1000_needs_two(agent: ApiClient) -> None:
    answer = evaluate(agent, {**BIG_REFUND, "amount_cents": 120000})
    assert (answer["rule"], answer["required_approvers"]) == ("refunds over $1,000", 2)


def test_it_writes_nothing_not_even_the_default_policy(agent: ApiClient) -> None:
    before = rows()
    evaluate(agent, BIG_REFUND)
    evaluate(agent, REFUND, capability="get-order-v1", status=422)
    assert rows() == before
    assert before["Policy"] == 0


def test_it_follows_the_current_policy_version(agent: ApiClient, tenant: Tenant) -> None:
    Policy.objects.create(tenant=tenant, capability_id="refund-order-v2", version=1, rules=[])
    Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=2,
        rules=[{"name": "every refund", "when": "amount_cents > 0", "approvers": 2}],
        on_expiry=Policy.OnExpiry.HAND_TO_HUMAN,
        expiry_seconds=600,
    )
    answer = evaluate(agent, REFUND)
    assert (answer["policy_version"], answer["rule"], answer["required_approvers"]) == (
        2,
        "every refund",
        2,
    )
    assert (answer["on_expiry"], answer["expiry_seconds"]) == ("hand_to_human", 600)


def test_the_proposal_meets_what_the_dry_run_said(agent: ApiClient, sandbox: Sandbox) -> None:
    answer = evaluate(agent, BIG_REFUND)
    call = propose(agent, BIG_REFUND)
    assert call["status"] == "awaiting_approval"
    assert (call["approval"]["rule"], call["approval"]["required_approvers"]) == (
        answer["rule"],
        answer["required_approvers"],
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"capability": "refund-order-v2", "args": {"order_id": "order-001", "x": 1}}, "args"),
        ({"capability": "no-such-v1", "args": {}}, "capability"),
    ],
)
def test_it_refuses_arguments_the_contract_refuses(agent: ApiClient, body: dict, field: str):
    response = agent.post("/api/v1/policy/evaluate", body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["name"] == "tool.validation_failed"
    assert field in {d["field"] for d in error["details"]}


def test_it_needs_a_key(client, db: None) -> None:
    response = client.post(
        "/api/v1/policy/evaluate",
        {"capability": "refund-order-v2", "args": REFUND},
        content_type="application/json",
    )
    assert response.status_code == 401
