"""The OpenAI Agents SDK adapter (countersign/openai_agents.py) with the real SDK and a scripted
model (no LLM, no network) against a live Countersign: PostgreSQL, a real worker process, the
sandbox. Countersign executes; the SDK only parks and resumes the agent."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from agents import Agent, Runner, RunState, function_tool, set_tracing_disabled
from agents.testing import function_call
from countersign import AsyncCountersign, Countersign, verify_webhook
from countersign.openai_agents import apply_decisions, countersign_tools
from django.db import connections

from examples.openai_agents_refund import REFUND, ScriptedRefundModel
from runs.models import Tenant, User
from tests.helpers import (
    ApiClient,
    WebhookReceiver,
    approval_of,
    decide,
    logged_in,
    run_async,
    wait_for,
)
from tests.integrations.conftest import approve_with_an_edit, held_call
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall, Webhook

# The tests that start a worker or an agent process are `slow`.
pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLE = "examples/openai_agents_refund.py"


@pytest.fixture(autouse=True)
def no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would send its traces to OpenAI


def refund_agent(cs: Any, run: dict, **options: Any) -> Agent:
    tools = countersign_tools(cs, run, capabilities=["refund-order-v2"], **options)
    return Agent(name="refunds", model=ScriptedRefundModel(), tools=tools)


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
            run = await cs.start_run("Refund order-003", external_ref="thread-oai-wait")
            result = await Runner.run(refund_agent(cs, run, wait_s=60), "Refund order-003")
            return run, result

    run, result = run_async(ask())
    person.join()
    assert not result.interruptions
    received = json.loads(result.final_output)
    call = ToolCall.objects.get(run_id=run["run_id"])
    assert call.intent == f"{run['run_id']}:call_refund_1"
    assert (received["tool_call_id"], received["status"]) == (call.pk, "succeeded")
    assert (received["edited"], received["executed_args"]["amount_cents"]) == (True, 15000)
    assert len(sandbox.ledger("payments")) == 1


@pytest.mark.slow
def test_it_parks_on_an_interruption_and_resumes_with_the_approvers_edit(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")

    async def park() -> tuple[dict, str]:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            run = await cs.start_run("Refund order-003", external_ref="thread-oai-1")
            result = await Runner.run(refund_agent(cs, run, interrupt=True), "Refund order-003")
            assert [i.name for i in result.interruptions] == ["refund-order-v2"]
            # Not decided yet: nothing to apply, the run stays parked.
            state = result.to_state()
            assert len(await apply_decisions(cs, run, state)) == 1
            return run, state.to_string()

    run, saved = run_async(park())
    call = held_call(run_id=run["run_id"])
    assert (call.agent_status, call.args) == ("awaiting_approval", REFUND)
    approve_with_an_edit(approver, call, 15000)

    async def resume() -> str:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            refunds = refund_agent(cs, run, interrupt=True)
            state = await RunState.from_string(refunds, saved)
            assert await apply_decisions(cs, run, state, wait=30) == []
            return (await Runner.run(refunds, state)).final_output

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
        run = cs.start_run("Refund order-003", external_ref="thread-oai-2")
        refunds = refund_agent(cs, run, interrupt=True)

        async def park() -> str:
            result = await Runner.run(refunds, "Refund order-003")
            return result.to_state().to_string()

        saved = run_async(park())
        call = held_call(run_id=run["run_id"])
        decide(
            logged_in(approver), approval_of({"tool_call_id": call.pk}), "reject", reason="fraud"
        )

        async def resume() -> str:
            state = await RunState.from_string(refunds, saved)
            assert await apply_decisions(cs, run, state) == []
            return (await Runner.run(refunds, state)).final_output

        received = run_async(resume())
    assert "rejected (fraud)" in received
    assert sandbox.ledger("payments") == []


class RefundAndWipe(ScriptedRefundModel):
    """Asks for the refund and, in the same turn, for a local tool that needs approval."""

    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any):
        response = await super().get_response(system_instructions, input, *args, **kwargs)
        if response.output[0].type == "function_call":
            response.output.append(function_call("wipe_disk", {}, call_id="call_wipe_1"))
        return response


def test_other_tools_interruptions_are_left_to_their_own_approvers(
    live_server, agent: ApiClient, sandbox: Sandbox
) -> None:
    @function_tool(needs_approval=True)
    def wipe_disk() -> str:
        """Not Countersign's: the application asks its own approvers."""
        return "wiped"

    with Countersign(live_server.url, agent.token) as cs:
        run = cs.start_run("Refund order-003", external_ref="thread-oai-4")
        tools = countersign_tools(cs, run, capabilities=["refund-order-v2"], interrupt=True)
        both = Agent(name="refunds", model=RefundAndWipe(), tools=[*tools, wipe_disk])
        result = run_async(Runner.run(both, "Refund order-003"))
        assert sorted(i.name for i in result.interruptions) == ["refund-order-v2", "wipe_disk"]
        waiting = run_async(apply_decisions(cs, run, result.to_state(), tools=tools))
    assert [i.name for i in waiting] == ["refund-order-v2"]


@pytest.mark.slow
def test_the_approval_decided_webhook_tells_the_parked_agent_to_resume(
    live_server,
    agent: ApiClient,
    approver: User,
    sandbox: Sandbox,
    start_celery,
    tenant: Tenant,
    webhook_receiver: WebhookReceiver,
) -> None:
    hook = Webhook.objects.create(
        tenant=tenant, url=webhook_receiver.url, event_types=["approval.decided"]
    )
    start_celery("worker")

    async def park() -> tuple[dict, str]:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            run = await cs.start_run("Refund order-003", external_ref="thread-oai-3")
            result = await Runner.run(refund_agent(cs, run, interrupt=True), "Refund order-003")
            return run, result.to_state().to_string()

    run, saved = run_async(park())
    call = held_call(run_id=run["run_id"])
    approve_with_an_edit(approver, call, 15000)
    wait_for(lambda: webhook_receiver.received, 30, "the approval.decided webhook")
    [delivery] = webhook_receiver.received
    event = verify_webhook(delivery.body, delivery.headers, hook.secret)
    assert (event["type"], event["data"]["tool_call"]["tool_call_id"]) == (
        "approval.decided",
        call.pk,
    )

    async def resume() -> str:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            tools = countersign_tools(cs, run, capabilities=["refund-order-v2"], interrupt=True)
            refunds = Agent(name="refunds", model=ScriptedRefundModel(), tools=tools)
            state = await RunState.from_string(refunds, saved)
            # The webhook said it is decided: no waiting.
            assert await apply_decisions(cs, run, state, tools=tools) == []
            return (await Runner.run(refunds, state)).final_output

    received = json.loads(run_async(resume()))
    assert (received["tool_call_id"], received["edited"]) == (call.pk, True)
    assert received["executed_args"]["amount_cents"] == 15000
    assert len(sandbox.ledger("payments")) == 1


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["parked", "before_saving"])
def test_an_agent_killed_after_proposing_resumes_from_its_saved_state(
    killed: str, agent_process, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")
    first = agent_process(EXAMPLE, agent.token, "first")
    call = held_call()
    # Parked: the paused RunState is on disk and the process polls for the decision.
    wait_for(lambda: "parked" in first.output(), 30, "the agent to park")
    first.kill()
    saved = json.loads(first.state.read_text())
    assert saved["run_state"]  # parked: what the second process starts from
    if killed == "before_saving":
        # As if killed between the proposal and writing the paused state: the second process
        # starts over in the same conversation, and its model asks for the same call again.
        first.state.write_text(json.dumps({"thread": saved["thread"], "run_state": None}))
    approve_with_an_edit(approver, call, 15000)
    second = agent_process(EXAMPLE, agent.token, "second")
    received = second.received()
    assert (received["tool_call_id"], received["status"]) == (call.pk, "succeeded")
    assert (received["edited"], received["executed_args"]["amount_cents"]) == (True, 15000)
    assert ToolCall.objects.count() == 1
    assert len(sandbox.ledger("payments")) == 1
