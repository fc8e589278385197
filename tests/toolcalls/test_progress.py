"""The progress contract and how runs end."""

from __future__ import annotations

import itertools

from runs.models import Run, Tenant, User
from tests.helpers import ApiClient, logged_in, make_user, propose, start_run
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch

SMALL = {"order_id": "order-002", "amount_cents": 1000, "currency": "USD"}
BIG = {"order_id": "order-003", "amount_cents": 25000, "currency": "USD"}


def test_the_contract_lists_verified_and_open_items_and_the_next_step(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    small = propose(agent, SMALL, run_id=run_id, intent="small")
    run_due()
    big = propose(agent, BIG, run_id=run_id, intent="big")
    contract = agent.get(f"/api/v1/runs/{run_id}/progress").json()
    assert [i["tool_call_id"] for i in contract["verified"]] == [small["tool_call_id"]]
    assert [(i["tool_call_id"], i["kind"]) for i in contract["open"]] == [
        (big["tool_call_id"], "awaiting_approval")
    ]
    approval_id = contract["open"][0]["approval_id"]
    assert approval_id.startswith("apr_")
    assert contract["next_safe_step"].startswith(f"Wait for approval {approval_id}")
    assert contract["budgets"]["tool_calls"] == {"used": 2, "max": 5, "left": 3}
    assert contract["budgets"]["attempts"] == {"used": 1, "max": 200, "left": 199}
    page = logged_in(approver).get(f"/runs/{run_id}/").content.decode()
    # The page says it in words for people, and keeps the agent's sentence under Details.
    assert "What happens next: A person decides Refund $250.00" in page
    assert contract["next_safe_step"] in page
    assert "Verified (1)" in page and "Open (1)" in page
    assert "2 used of 5, 3 left" in page


def test_an_unknown_outcome_says_do_not_send_again(agent: ApiClient, sandbox: Sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call = propose(agent, SMALL, run_id=run_id, intent="small")
    dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
    contract = agent.get(f"/api/v1/runs/{run_id}/progress").json()
    assert contract["open"][0]["kind"] == "result_unknown"
    assert "Do not send it again" in contract["next_safe_step"]


def test_a_run_of_verified_calls_completes(agent: ApiClient, sandbox: Sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    propose(agent, SMALL, run_id=run_id, intent="small")
    run_due()
    assert "finish the run" in agent.get(f"/api/v1/runs/{run_id}/progress").json()["next_safe_step"]
    response = agent.post(f"/api/v1/runs/{run_id}/complete")
    assert response.status_code == 200
    assert response.json()["state"] == "completed"


def test_a_run_with_a_failed_call_completes_with_degradation(agent, sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    propose(agent, SMALL, run_id=run_id, intent="small")
    propose(
        agent,
        {"order_id": "order-002", "address_id": "addr-bad-001"},
        run_id=run_id,
        intent="ship",
        capability="create-waybill-v1",
    )
    run_due()
    response = agent.post(f"/api/v1/runs/{run_id}/complete")
    assert response.json()["state"] == "completed_with_degradation"


def test_a_run_with_an_unknown_outcome_ends_needing_a_human(agent, sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call = propose(agent, SMALL, run_id=run_id, intent="small")
    dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
    response = agent.post(f"/api/v1/runs/{run_id}/complete")
    assert response.json()["state"] == "needs_human"


def test_a_run_with_work_in_flight_cannot_finish(agent: ApiClient, sandbox: Sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    call = propose(agent, BIG, run_id=run_id, intent="big")
    response = agent.post(f"/api/v1/runs/{run_id}/complete")
    assert response.status_code == 409
    assert response.json()["error"]["name"] == "run.work_in_flight"
    assert response.json()["error"]["details"][0]["tool_call_id"] == call["tool_call_id"]
    assert Run.objects.get(pk=run_id).state == "waiting"


def test_the_agent_may_declare_permanent_failure(agent: ApiClient, sandbox: Sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    response = agent.post(
        f"/api/v1/runs/{run_id}/complete",
        {"failed_permanently": True, "reason": "order was fraudulent"},
    )
    assert response.json()["state"] == "failed_permanently"
    assert agent.post(f"/api/v1/runs/{run_id}/complete").status_code == 409


def test_tool_call_events_name_their_cause(agent: ApiClient, sandbox: Sandbox) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    call = propose(agent, SMALL, run_id=run_id, intent="small")
    run_due()
    events = list(Run.objects.get(pk=run_id).events.filter(tool_call_id=call["tool_call_id"]))
    assert events[0].causation_id == ""
    for previous, event in itertools.pairwise(events):
        assert event.causation_id == previous.id


def test_another_tenant_cannot_read_or_finish_a_run(
    agent: ApiClient, other_agent: ApiClient, other_tenant: Tenant, sandbox: Sandbox
) -> None:
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    for response in (
        other_agent.get(f"/api/v1/runs/{run_id}/progress"),
        other_agent.post(f"/api/v1/runs/{run_id}/complete"),
    ):
        assert response.status_code == 404
    outsider = logged_in(make_user("mallory", other_tenant, User.Role.ADMIN))
    assert outsider.post(f"/desk/runs/{run_id}/resume/").status_code == 404
    assert Run.objects.get(pk=run_id).state == "active"
