"""An API key proposes only the capabilities its scopes name: a capability id, a permission
(`payments.refund`), a permission group (`payments.*`) or `*`. Anything else is 403
`auth.scope_missing`, and nothing is written."""

from __future__ import annotations

import pytest

from runs.models import Event, OutboxMessage, Tenant, User
from runs.services import api_key_issue
from tests.helpers import REFUND, ApiClient, propose, start_run
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch
from toolcalls.models import ToolCall


def agent_with(tenant: Tenant, owner: User, *scopes: str) -> ApiClient:
    key, token = api_key_issue(tenant=tenant, name="scoped", principal=owner, scopes=scopes)
    return ApiClient(token, key)


def written() -> tuple[int, int, int]:
    return ToolCall.objects.count(), Event.objects.count(), OutboxMessage.objects.count()


def test_a_key_without_the_scope_gets_403_and_nothing_is_written(
    tenant: Tenant, owner: User, sandbox: Sandbox
) -> None:
    agent = agent_with(tenant, owner, "orders.read")
    run_id = start_run(agent)
    before = written()
    refusal = propose(agent, REFUND, run_id=run_id, status=403)
    assert refusal["error"]["name"] == "auth.scope_missing"
    assert "payments.refund" in refusal["error"]["message"]
    assert written() == before
    assert ToolCall.objects.count() == 0


def test_a_replayed_proposal_is_refused_to_a_key_without_the_scope(
    agent: ApiClient, tenant: Tenant, owner: User, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    propose(agent, REFUND, run_id=run_id)
    reader = agent_with(tenant, owner, "orders.read")
    refusal = propose(reader, REFUND, run_id=run_id, status=403)
    assert refusal["error"]["name"] == "auth.scope_missing"


@pytest.mark.parametrize("scope", ["*", "payments.refund", "payments.*", "refund-order-v2"])
def test_a_scope_that_names_the_capability_allows_it(
    scope: str, tenant: Tenant, owner: User, sandbox: Sandbox
) -> None:
    agent = agent_with(tenant, owner, "orders.read", scope)
    call = propose(agent, REFUND)
    assert call["capability"] == "refund-order-v2"


def test_a_permission_scope_allows_only_its_capabilities(
    tenant: Tenant, owner: User, sandbox: Sandbox
) -> None:
    agent = agent_with(tenant, owner, "payments.refund")
    run_id = start_run(agent)
    propose(agent, REFUND, run_id=run_id)
    stock = {"warehouse_id": "wh-acme-1", "sku": "PART-100"}
    refusal = propose(agent, stock, capability="check-stock-v1", run_id=run_id, status=403)
    assert refusal["error"]["name"] == "auth.scope_missing"


def test_a_key_with_no_scopes_proposes_nothing(
    tenant: Tenant, owner: User, sandbox: Sandbox
) -> None:
    agent = agent_with(tenant, owner)
    refusal = propose(agent, REFUND, status=403)
    assert refusal["error"]["name"] == "auth.scope_missing"


def test_compensating_needs_the_scope_of_the_compensating_capability(
    agent: ApiClient, tenant: Tenant, owner: User, sandbox: Sandbox
) -> None:
    reserve = {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1}
    reserve["order_id"] = "order-002"
    reserve_id = propose(agent, reserve, capability="reserve-stock-v1")["tool_call_id"]
    run_due()
    refunder = agent_with(tenant, owner, "payments.refund")
    before = written()
    refusal = refunder.post(f"/api/v1/tool-calls/{reserve_id}/compensate")
    assert refusal.status_code == 403
    assert refusal.json()["error"]["name"] == "auth.scope_missing"
    assert "release-stock-v1" in refusal.json()["error"]["message"]
    assert written() == before
    stock_keeper = agent_with(tenant, owner, "stock.*")
    assert stock_keeper.post(f"/api/v1/tool-calls/{reserve_id}/compensate").status_code == 201
    assert refunder.post(f"/api/v1/tool-calls/{reserve_id}/compensate").status_code == 403


def test_retrying_needs_the_scope_of_the_call(
    agent: ApiClient, tenant: Tenant, owner: User, sandbox: Sandbox, monkeypatch
) -> None:
    monkeypatch.setattr(dispatch, "backoff", lambda policy, failures, retry_after: 0.0)
    sandbox.faults(system="payments", http_429=1.0, retry_after=0, times=6)
    call_id = propose(agent, REFUND)["tool_call_id"]
    run_due()
    assert ToolCall.objects.get(pk=call_id).execution_status == "failed"
    before = written()
    refusal = agent_with(tenant, owner, "orders.read").post(f"/api/v1/tool-calls/{call_id}/retry")
    assert refusal.status_code == 403
    assert refusal.json()["error"]["name"] == "auth.scope_missing"
    assert written() == before
    refunder = agent_with(tenant, owner, "payments.refund")
    assert refunder.post(f"/api/v1/tool-calls/{call_id}/retry").status_code == 202
