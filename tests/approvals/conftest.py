from __future__ import annotations

import pytest
from django.test import Client

from runs.models import Tenant, User
from runs.services import api_key_issue
from tests.conftest import ApiClient, make_user

BIG_REFUND = {
    "order_id": "order-003",
    "amount_cents": 25000,
    "currency": "USD",
    "reason": "duplicate charge",
}


@pytest.fixture
def owner(tenant: Tenant) -> User:
    """The person the agent acts for."""
    return make_user("agent-owner", tenant, User.Role.APPROVER)


@pytest.fixture
def agent(owner: User, tenant: Tenant) -> ApiClient:
    return ApiClient(api_key_issue(tenant=tenant, name="agent", principal=owner)[1])


@pytest.fixture
def bob(tenant: Tenant) -> User:
    return make_user("bob", tenant, User.Role.APPROVER)


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def propose(agent: ApiClient, args: dict = BIG_REFUND, intent: str = "big-1") -> dict:
    run_id = agent.post("/api/v1/runs", {"title": "refund"}).json()["run_id"]
    response = agent.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"capability": "refund-order-v2", "args": args, "intent": intent},
    )
    assert response.status_code == 201, response.json()
    return response.json()


# Each decision has its own URL: approve, reject, edit (approve with edits).
def decide(client: Client, approval, action: str, **fields):
    return client.post(
        f"/approvals/{approval.pk}/{action}/",
        {
            "version": approval.version,
            "summary_hash": approval.summary_hash,
            **fields,
        },
    )
