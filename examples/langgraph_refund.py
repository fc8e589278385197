"""A LangChain agent (`create_agent`) whose refund Countersign executes.

    pip install "./client[langgraph]"
    COUNTERSIGN_URL=http://127.0.0.1:8000 COUNTERSIGN_API_KEY=cs_... \\
        python -m examples.langgraph_refund --thread refund-42

The model is scripted (no LLM, no network): it asks to refund $250 of order-003 — over $200,
so an approver decides in the console — then tells the user what the tool answered. The tool
call waits `--wait` seconds; undecided by then, the graph parks (an interrupt) with its state
in `--checkpoints`, and this script follows the call until it is decided and resumes the graph
(`--park`: print the approval link and exit instead). Run it again with the same `--thread` —
after `--park`, or after the process was killed at any point — and it goes on from the saved
state: the node proposes the same key again, gets the same call back, and the refund happens
once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from countersign import Countersign
from countersign.langgraph import CountersignMiddleware
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from examples.demo_agents import Rounds
from examples.file_saver import FileSaver

REFUND = {"order_id": "order-003", "amount_cents": 25000, "currency": "USD"}


class ScriptedModel(BaseChatModel):
    """Stands in for an LLM: asks for one refund, then repeats what the tool answered. It reads
    only the messages, so a restarted process gets the same answers."""

    refund: dict[str, Any] = REFUND
    tool_name: str = "refund-order-v2"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        answers = [m for m in messages if isinstance(m, ToolMessage)]
        if answers:
            message = AIMessage(content=f"The refund tool said: {answers[-1].content}")
        else:
            call = {"name": self.tool_name, "args": self.refund, "id": "call_refund_1"}
            message = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def build_agent(cs: Countersign, saver: Any, wait_s: float, refund: dict = REFUND) -> Any:
    middleware = CountersignMiddleware(cs, ["refund-order-v2"], wait_s=wait_s)
    return create_agent(ScriptedModel(refund=refund), middleware=[middleware], checkpointer=saver)


def show(line: dict) -> None:
    print(json.dumps(line), flush=True)


def run_agent(
    agent: Any,
    cs: Countersign,
    thread_id: str,
    *,
    park: bool = False,
    say: Callable[[dict], None] = show,
) -> dict:
    """Start the thread, or go on from where its saved state stopped; returns the final state,
    or the interrupt's payload when parked."""
    config = {"configurable": {"thread_id": thread_id}}
    saved = agent.get_state(config)
    if saved.interrupts:
        step: Any = Command(resume={"type": "check"})  # nobody decides through the graph
        say({"resumed": "parked"})
    elif saved.next:
        step = None  # stopped mid-step (killed): run what was pending
        say({"resumed": list(saved.next)})
    elif saved.values.get("messages"):
        return saved.values  # this thread is finished
    else:
        step = {"messages": [HumanMessage("The customer was charged twice: refund $250.")]}
    while True:
        state = agent.invoke(step, config)
        if not state.get("__interrupt__"):
            return state
        parked = state["__interrupt__"][0].value
        say({"parked": parked["countersign"]})
        if park:
            return parked
        # Follow the call until people decide, then let the node look again.
        cs.wait(parked["countersign"]["tool_call_id"], timeout=3600)
        step = Command(resume={"type": "check"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("COUNTERSIGN_API_KEY", ""))
    parser.add_argument("--thread", default="refund-1", help="the conversation's thread id")
    parser.add_argument("--checkpoints", default="var/langgraph-checkpoints.pickle")
    parser.add_argument("--wait", type=float, default=20, help="seconds a tool call waits")
    parser.add_argument("--park", action="store_true", help="exit when parked")
    options = parser.parse_args()
    with Countersign(options.url, options.api_key) as cs:
        agent = build_agent(cs, FileSaver(options.checkpoints), options.wait)
        state = run_agent(agent, cs, options.thread, park=options.park)
    if "messages" in state:
        show({"answer": state["messages"][-1].content})


class DemoRounds(Rounds):
    """`bin/demo --agent langgraph`: each round a new thread asks to refund $250 of one of the
    seeded orders; an approver decides in the demo's console and the agent goes on."""

    log = logging.getLogger("countersign.demo_agent")
    started = int(time.time())  # thread ids must be new at every start of the demo

    def one_round(self, cs: Countersign, number: int) -> None:
        refund = {**REFUND, "order_id": f"order-00{3 + number % 4}"}
        agent = build_agent(cs, InMemorySaver(), wait_s=5, refund=refund)
        thread_id = f"demo-{self.started}-{number}"
        state = run_agent(agent, cs, thread_id, say=lambda line: self.log.info("%s", line))
        self.log.info("langgraph agent, %s: %s", thread_id, state["messages"][-1].content)


if __name__ == "__main__":
    main()
