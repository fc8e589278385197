"""The Pydantic AI toolset (countersign/pydantic_ai.py) with the real package and a scripted
model (`FunctionModel`: no LLM, no network) against a live Countersign: PostgreSQL, a real
worker process, the sandbox. Countersign executes; Pydantic AI only parks and resumes."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from countersign import AsyncCountersign, Countersign
from countersign.pydantic_ai import CALL_ID, CountersignToolset, deferred_results
from django.db import connections
from pydantic_ai import Agent, DeferredToolRequests

from examples.pydantic_ai_refund import REFUND, scripted_model
from runs.models import User
from tests.helpers import ApiClient, approval_of, decide, logged_in, run_async, wait_for
from tests.integrations.conftest import approve_with_an_edit, held_call
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

# The tests that start a worker or an agent process are `slow`.
pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = "examples/pydantic_ai_refund.py"


def refund_agent(cs: Any, run: dict, wait_s: float) -> Agent:
    toolset = CountersignToolset(cs, run, capabilities=["refund-order-v2"], wait_s=wait_s)
    return Agent(scripted_model(), toolsets=[toolset], output_type=[str, DeferredToolRequests])


@pytest.mark.slow
def test_the_tool_proposes_with_the_run_and_the_models_call_id_and_waits(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")

    def approve_when_asked() -> None:
        try:
            approve_with_an_edit(approver, held_call(), 15000)
        finally:
            connections.close_all()

    person = threading.Thread(target=approve_when_asked)
    person.start()

    async def ask() -> tuple[dict, Any]:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            run = await cs.start_run("Refund order-003", external_ref="thread-pyd-wait")
            result = await refund_agent(cs, run, wait_s=60).run("Refund order-003")
            return run, result.output

    run, output = run_async(ask())
    person.join()
    received = json.loads(output)
    call = ToolCall.objects.get(run_id=run["run_id"])
    assert call.intent == f"{run['run_id']}:call_refund_1"
    assert (received["tool_call_id"], received["status"]) == (call.pk, "succeeded")
    assert (received["edited"], received["executed_args"]["amount_cents"]) == (True, 15000)
    assert len(sandbox.ledger("payments")) == 1


@pytest.mark.slow
def test_it_defers_the_call_and_resumes_with_the_approvers_edit(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")

    async def park() -> tuple[dict, list, DeferredToolRequests]:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            run = await cs.start_run("Refund order-003", external_ref="thread-pyd-1")
            result = await refund_agent(cs, run, wait_s=0.5).run("Refund order-003")
            requests = result.output
            assert isinstance(requests, DeferredToolRequests)
            # Nobody has decided: no result yet, the call stays deferred.
            assert requests.remaining(await deferred_results(cs, requests)) is not None
            return run, result.all_messages(), requests

    run, history, requests = run_async(park())
    call = held_call(run_id=run["run_id"])
    [deferred] = requests.calls
    assert requests.metadata[deferred.tool_call_id][CALL_ID] == call.pk
    assert (call.agent_status, call.args) == ("awaiting_approval", REFUND)
    approve_with_an_edit(approver, call, 15000)

    async def resume() -> str:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            results = await deferred_results(cs, requests, wait=30)
            assert requests.remaining(results) is None
            refunds = refund_agent(cs, run, wait_s=0.5)
            result = await refunds.run(message_history=history, deferred_tool_results=results)
            return result.output

    received = json.loads(run_async(resume()))
    assert (received["status"], received["edited"]) == ("succeeded", True)
    assert received["executed_args"]["amount_cents"] == 15000
    assert received["decision"]["by"] == ["alice"]
    assert ToolCall.objects.filter(run_id=run["run_id"]).count() == 1
    assert len(sandbox.ledger("payments")) == 1


def test_a_rejection_reaches_the_model_with_the_reason_and_nothing_runs(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    with Countersign(live_server.url, agent.token) as cs:  # the sync client works too
        run = cs.start_run("Refund order-003", external_ref="thread-pyd-2")
        refunds = refund_agent(cs, run, wait_s=0.2)
        result = run_async(refunds.run("Refund order-003"))
        call = held_call(run_id=run["run_id"])
        approval = approval_of({"tool_call_id": call.pk})
        decide(logged_in(approver), approval, "reject", reason="fraud")
        results = run_async(deferred_results(cs, result.output))
        resumed = run_async(
            refunds.run(message_history=result.all_messages(), deferred_tool_results=results)
        )
    received = json.loads(resumed.output)
    assert received["status"] == "rejected"
    assert "rejected (fraud)" in received["note"]
    assert sandbox.ledger("payments") == []


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["parked", "before_saving"])
def test_an_agent_killed_after_proposing_resumes_from_its_saved_state(
    killed: str, agent_process, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")
    first = agent_process(EXAMPLE, agent.token, "first")
    call = held_call()
    # Parked: history and deferred requests are on disk and the process polls.
    wait_for(lambda: "parked" in first.output(), 30, "the agent to park")
    first.kill()
    saved = json.loads(first.state.read_text())
    assert saved["history"]  # parked: what the second process starts from
    if killed == "before_saving":
        # As if killed between the proposal and writing the paused state: the second process
        # starts over in the same conversation, and its model asks for the same call again.
        first.state.write_text(json.dumps({"thread": saved["thread"], "history": None}))
    approve_with_an_edit(approver, call, 15000)
    second = agent_process(EXAMPLE, agent.token, "second")
    received = second.received()
    assert (received["tool_call_id"], received["status"]) == (call.pk, "succeeded")
    assert (received["edited"], received["executed_args"]["amount_cents"]) == (True, 15000)
    assert ToolCall.objects.count() == 1
    assert len(sandbox.ledger("payments")) == 1
