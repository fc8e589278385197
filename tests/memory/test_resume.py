"""GET /api/v1/runs/{id}/resume: what a fresh agent needs to continue, from stored state."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import pytest

from approvals.models import Policy
from runs.models import Event
from tests.helpers import BIG_REFUND, ROOT, ApiClient, approval_of, propose, start_run
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch
from toolcalls.models import ObjectRevision

DONE = {"order_id": "order-001", "amount_cents": 1000, "currency": "USD"}
LOST = {"order_id": "order-002", "amount_cents": 1500, "currency": "USD"}


@pytest.fixture
def interrupted_run(agent: ApiClient, sandbox: Sandbox) -> dict[str, Any]:
    """A run that crashed mid-way: one refund verified, one whose response was lost after
    the payment system committed it (result_unknown), one waiting for an approver, and the
    agent's checkpoint naming them."""
    run_id = start_run(agent, "three refunds", max_tool_calls=5)
    done = propose(agent, DONE, run_id=run_id, intent="done")
    run_due()
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    lost = propose(agent, LOST, run_id=run_id, intent="lost")
    dispatch.tool_call_dispatch(tool_call_id=lost["tool_call_id"])
    waiting = propose(
        agent, BIG_REFUND, run_id=run_id, intent="big", object={"ref": "", "revision": 1}
    )
    ids = [done["tool_call_id"], lost["tool_call_id"], waiting["tool_call_id"]]
    checkpoint = agent.put(
        f"/api/v1/runs/{run_id}/checkpoints/main",
        {"schema_version": 1, "state": "refunding", "step_index": 3, "tool_call_ids": ids},
    ).json()
    return {"run_id": run_id, "calls": ids, "checkpoint": checkpoint}


def test_it_lists_the_unknown_call_and_the_pending_approval(
    agent: ApiClient, interrupted_run: dict[str, Any], settings: Any
) -> None:
    done, lost, waiting = interrupted_run["calls"]
    events_before = Event.objects.count()
    contract = agent.get(f"/api/v1/runs/{interrupted_run['run_id']}/resume").json()

    assert [c["checkpoint_id"] for c in contract["checkpoints"]] == [
        interrupted_run["checkpoint"]["checkpoint_id"]
    ]
    assert contract["checkpoints"][0]["tool_call_ids"] == interrupted_run["calls"]

    [unknown] = contract["unknown_calls"]
    assert (unknown["tool_call_id"], unknown["execution_status"]) == (lost, "result_unknown")
    assert unknown["agent_may_retry"] is False
    assert "do not send it again" in unknown["what_happens"]
    assert any("Never send again a call listed in unknown_calls" in r for r in contract["rules"])

    [pending] = contract["pending_approvals"]
    approval = approval_of({"tool_call_id": waiting})
    assert pending["approval_id"] == approval.pk and pending["tool_call_id"] == waiting
    assert pending["approval_url"] == f"{settings.COUNTERSIGN_BASE_URL}/approvals/{approval.pk}/"

    [receipt] = contract["receipts"]
    assert receipt["tool_call_id"] == done and receipt["external_id"].startswith("re_")
    assert receipt["raw_response"]["amount_cents"] == DONE["amount_cents"]

    assert {(i["tool_call_id"], i["kind"]) for i in contract["progress"]["open"]} == {
        (lost, "result_unknown"),
        (waiting, "awaiting_approval"),
    }
    assert [i["tool_call_id"] for i in contract["progress"]["verified"]] == [done]
    assert Event.objects.count() == events_before  # a read writes nothing


def test_it_says_what_the_runtime_checks_again_as_it_stands_now(
    agent: ApiClient, interrupted_run: dict[str, Any], tenant: Any
) -> None:
    _done, lost, waiting = interrupted_run["calls"]
    # Since the proposal: an admin asked for two approvers over $200, and another write moved
    # the order to its next revision.
    current = Policy.objects.get(tenant=tenant, capability_id="refund-order-v2")
    Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=current.version + 1,
        rules=[{"name": "two over $200", "when": "amount_cents > 20000", "approvers": 2}],
    )
    ObjectRevision.objects.filter(tenant=tenant, ref="order:order-003").update(revision=2)

    checks = agent.get(f"/api/v1/runs/{interrupted_run['run_id']}/resume").json()[
        "revalidated_on_resume"
    ]
    by_call = {check["tool_call_id"]: check for check in checks["tool_calls"]}
    assert set(by_call) == {lost, waiting}  # the verified call will not be sent again
    big = by_call[waiting]
    assert big["policy"] == {
        "version_at_approval": current.version,
        "version_now": current.version + 1,
        "approvers_at_approval": 1,
        "approvers_needed_now": 2,
        "changed": True,
    }
    assert big["object"] == {
        "ref": "order:order-003",
        "revision_at_proposal": 1,
        "revision_now": 2,
        "changed": True,
    }
    assert big["permission"] == "payments.refund"
    assert by_call[lost]["object"] is None and by_call[lost]["approval"] is None
    assert checks["api_key"]["permissions_needed"] == ["payments.refund"]
    assert checks["api_key"]["active"] is True


def test_another_tenant_gets_nothing(
    other_agent: ApiClient, interrupted_run: dict[str, Any]
) -> None:
    response = other_agent.get(f"/api/v1/runs/{interrupted_run['run_id']}/resume")
    assert response.status_code == 404


def test_a_checkpoint_without_a_migration_path_is_named_in_the_contract(
    agent: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory import schemas

    monkeypatch.setitem(schemas.MIGRATIONS, ("planner", 2), lambda body: body)
    run_id = start_run(agent)
    agent.put(
        f"/api/v1/runs/{run_id}/checkpoints/plan",
        {"schema_version": 1, "kind": "planner", "state": "s", "step_index": 0},
    )
    [checkpoint] = agent.get(f"/api/v1/runs/{run_id}/resume").json()["checkpoints"]
    assert checkpoint["error"]["name"] == "checkpoint.no_migration_path"
    assert checkpoint["written_schema_version"] == 1


def checkout_client() -> Any:
    """The client package of this checkout (a shared virtualenv may have installed another
    checkout's, editable)."""
    sys.path.insert(0, str(ROOT / "client"))
    try:
        for name in [m for m in sys.modules if m == "countersign" or m.startswith("countersign.")]:
            del sys.modules[name]
        return importlib.import_module("countersign")
    finally:
        sys.path.remove(str(ROOT / "client"))


def test_the_client_reads_it(live_server: Any, agent: ApiClient) -> None:
    client = checkout_client().Countersign(live_server.url, agent.token)
    run = client.start_run("resumable")
    client.put_checkpoint(run["run_id"], "main", state="started", step_index=0, schema_version=1)
    contract = client.resume(run["run_id"])
    assert contract["run"]["run_id"] == run["run_id"]
    assert contract["checkpoints"][0]["state"] == "started"
    assert contract["unknown_calls"] == [] and contract["pending_approvals"] == []
