"""The LangGraph / LangChain adapter (countersign.langgraph) with the real packages and a scripted
model (examples/langgraph_refund.py: no LLM, no network), against a live Countersign:
pytest-django's live server on PostgreSQL, a real Celery worker process, the sandbox over HTTP.

The agent asks for a refund over the threshold; the graph parks; an approver approves with an
edit in the console; the agent resumes and the model is told what ran; the sandbox's ledger
shows one refund — also when the agent's process is killed after proposing and started again
from its saved state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from countersign import Countersign
from countersign.langgraph import CountersignMiddleware, countersign_tools, intent_for
from django.core.management import call_command
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from examples.langgraph_refund import REFUND, ScriptedModel, build_agent, run_agent
from runs.models import User
from tests import helpers
from tests.helpers import ROOT, ApiClient, approval_of, decide, logged_in, run_async, wait_for
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cs(live_server, agent: ApiClient, sandbox: Sandbox) -> Any:
    with Countersign(live_server.url, agent.token) as client:
        yield client


def approve_with_an_edit(approver: User, call_id: str) -> None:
    approval = approval_of({"tool_call_id": call_id})
    answer = decide(
        logged_in(approver), approval, "edit", edit__amount_cents="15000", reason="half"
    )
    assert answer.status_code in (200, 302), answer.content


def refunds(sandbox: Sandbox) -> list[dict[str, Any]]:
    return [e for e in sandbox.ledger("payments") if e["operation"] == "refund.create"]


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_the_agent_parks_and_the_model_is_told_what_the_approver_changed(
    cs: Countersign, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")
    agent = build_agent(cs, InMemorySaver(), wait_s=1)

    parked = run_agent(agent, cs, "thread-1", park=True)
    # LangChain's human-in-the-loop request, and the Countersign call behind it.
    assert parked["action_requests"][0]["name"] == "refund-order-v2"
    assert parked["action_requests"][0]["args"] == REFUND
    assert parked["review_configs"] == [{"action_name": "refund-order-v2", "allowed_decisions": []}]
    call_id = parked["countersign"]["tool_call_id"]
    assert parked["countersign"]["status"] == "awaiting_approval"
    assert parked["countersign"]["approval_url"].endswith("/")
    assert ToolCall.objects.get(pk=call_id).intent == "thread-1:call_refund_1"

    # An "approve" sent through the graph is not an approval: the node looks again, gets the
    # same call back and parks again.
    config = {"configurable": {"thread_id": "thread-1"}}
    again = agent.invoke(Command(resume={"type": "approve"}), config)["__interrupt__"][0].value
    assert again["countersign"]["tool_call_id"] == call_id
    assert ToolCall.objects.count() == 1
    assert refunds(sandbox) == []

    approve_with_an_edit(approver, call_id)
    state = run_agent(agent, cs, "thread-1")

    [answer] = tool_messages(state)
    assert answer.status == "success"
    assert "alice edited the call before it ran (reason: half)" in answer.content
    assert "amount_cents 25000 -> 15000" in answer.content
    assert answer.artifact["executed_args"]["amount_cents"] == 15000
    # The model received it: its last message repeats what the tool said.
    assert isinstance(state["messages"][-1], AIMessage)
    assert "amount_cents 25000 -> 15000" in state["messages"][-1].content
    [refund] = refunds(sandbox)
    assert refund["payload"]["amount_cents"] == 15000
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def agent_process(live_server, agent: ApiClient, checkpoints: str, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "examples.langgraph_refund", "--url", live_server.url]
    command += ["--api-key", agent.token, "--thread", "thread-killed"]
    command += ["--checkpoints", checkpoints, "--wait", "60"]
    # This checkout's client package, ahead of whichever copy the virtualenv installed.
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'client'}{os.pathsep}{ROOT}"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_an_agent_killed_after_proposing_and_restarted_from_its_saved_state_refunds_once(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery, tmp_path
) -> None:
    start_celery("worker")
    checkpoints = str(tmp_path / "checkpoints.pickle")
    log_path = tmp_path / "agent.log"
    with log_path.open("ab") as log:
        first = agent_process(live_server, agent, checkpoints, log)
        intent = "thread-killed:call_refund_1"
        wait_for(lambda: ToolCall.objects.filter(intent=intent).exists(), 60, "the proposal")
        assert first.poll() is None, log_path.read_text()
        first.kill()  # SIGKILL, in the middle of the tool call's wait
        first.wait(timeout=10)
    call = ToolCall.objects.get(intent=intent)

    # Decided and executed while no agent process is alive.
    approve_with_an_edit(approver, call.pk)
    wait_for(lambda: len(refunds(sandbox)) == 1, 60, "the refund")

    with log_path.open("ab") as log:
        second = agent_process(live_server, agent, checkpoints, log)
        assert second.wait(timeout=120) == 0, log_path.read_text()
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line[:1] == "{"]
    # It went on from its saved state (the tools step it was killed in), not from the start.
    assert {"resumed": ["tools"]} in lines
    answer = lines[-1]["answer"]
    assert "amount_cents 25000 -> 15000" in answer
    assert ToolCall.objects.count() == 1
    [refund] = refunds(sandbox)
    assert refund["payload"]["amount_cents"] == 15000
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def test_the_middleware_sends_the_agents_own_tool_to_countersign(
    cs: Countersign, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")
    bodies_run = []

    @tool
    def refund_order(order_id: str, amount_cents: int, currency: str) -> str:
        """Refund an order."""
        bodies_run.append(order_id)
        return "refunded by the tool's own body"

    middleware = CountersignMiddleware(cs, route={"refund_order": "refund-order-v2"}, wait_s=30)
    model = ScriptedModel(refund=helpers.REFUND, tool_name="refund_order")
    agent = create_agent(
        model, [refund_order], middleware=[middleware], checkpointer=InMemorySaver()
    )

    state = agent.invoke(
        {"messages": [HumanMessage("refund")]}, {"configurable": {"thread_id": "t"}}
    )

    [answer] = tool_messages(state)
    assert answer.content.startswith("Countersign: succeeded. Result: ")
    assert answer.artifact["intent"] == "t:call_refund_1"
    assert bodies_run == []  # Countersign executed it, not the tool's body
    assert len(refunds(sandbox)) == 1


def test_an_async_agent_parks_the_same_way(cs: Countersign, sandbox: Sandbox) -> None:
    agent = build_agent(cs, InMemorySaver(), wait_s=0.5)
    config = {"configurable": {"thread_id": "thread-async"}}

    state = run_async(agent.ainvoke({"messages": [HumanMessage("refund")]}, config))

    [parked] = state["__interrupt__"]
    assert parked.value["countersign"]["status"] == "awaiting_approval"
    assert ToolCall.objects.get().intent == "thread-async:call_refund_1"


# --- the tool wrapper alone, in a graph of one's own -------------------------------------------


def a_graph(cs: Countersign, refund: dict[str, Any]) -> Any:
    tools = countersign_tools(
        cs, ["refund-order-v2"], names={"refund-order-v2": "refund"}, wait_s=1
    )
    model = ScriptedModel(refund=refund, tool_name="refund")

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver())


def test_a_rejection_reaches_the_model_and_nothing_runs(
    cs: Countersign, approver: User, sandbox: Sandbox
) -> None:
    graph = a_graph(cs, REFUND)
    config = {"configurable": {"thread_id": "thread-rejected"}}
    start = {"messages": [HumanMessage("refund order-003")]}
    [parked] = graph.invoke(start, config)["__interrupt__"]
    call_id = parked.value["countersign"]["tool_call_id"]
    approval = approval_of({"tool_call_id": call_id})
    decide(logged_in(approver), approval, "reject", reason="already refunded by hand")

    state = graph.invoke(Command(resume={"type": "check"}), config)

    [answer] = tool_messages(state)
    assert answer.status == "error"
    assert answer.content.startswith(
        "Countersign: rejected by alice (reason: already refunded by hand). Nothing was executed."
    )
    assert refunds(sandbox) == []


def test_arguments_countersign_refuses_go_back_to_the_model(cs: Countersign) -> None:
    graph = a_graph(cs, {**REFUND, "amount_cents": 9_000_000})  # more than the order's total
    config = {"configurable": {"thread_id": "thread-refused"}}

    state = graph.invoke({"messages": [HumanMessage("refund order-003")]}, config)

    [answer] = tool_messages(state)
    assert answer.status == "error"
    assert answer.content.startswith("Countersign refused the call (")
    assert "args.amount_cents" in answer.content
    assert not ToolCall.objects.exists()


def test_the_key_is_the_thread_and_the_tool_call() -> None:
    assert intent_for("thread-7", "call_abc") == "thread-7:call_abc"
    # A thread id the API's intent pattern refuses is replaced by a digest, the same each time.
    odd = intent_for("thread 7/é", "call_abc")
    assert odd == intent_for("thread 7/é", "call_abc") != intent_for("thread 7/é", "call_abd")
    assert odd.startswith("lg-") and len(odd) == 51
