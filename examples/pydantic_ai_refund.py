"""A Pydantic AI agent whose refund Countersign executes, parked with deferred tools while a
person decides (countersign/pydantic_ai.py).

    export COUNTERSIGN_URL=http://127.0.0.1:8000 COUNTERSIGN_API_KEY=cs_...
    python examples/pydantic_ai_refund.py --state var/pydantic-ai-refund.json

The model is scripted (`FunctionModel`: no LLM, no network): it asks to refund $250 of
order-003, over the $200 a person must approve. The tool proposes and waits a few seconds;
nobody has decided yet, so it defers the call and the run ends with `DeferredToolRequests`.
The agent saves the message history and the deferred requests to `--state`, polls Countersign
until the call has finished (approved, rejected, or approved with an edit in the console),
resumes with `DeferredToolResults`, and prints what the model received: what actually ran.
Kill it while it waits and start it again with the same `--state`: it carries on from the
saved state, and the refund still happens once.

For a real model, replace `scripted_model()` with a model name ("openai:gpt-4.1").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from countersign import AsyncCountersign
from countersign.pydantic_ai import CountersignToolset, deferred_results
from pydantic import TypeAdapter
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

REFUND = {
    "order_id": "order-003",
    "amount_cents": 25000,
    "currency": "USD",
    "reason": "duplicate charge",
}
REQUESTS = TypeAdapter(DeferredToolRequests)


def scripted_model() -> FunctionModel:
    """Asks for the refund; once it has the tool's answer, repeats it as its final answer (so
    whoever runs the agent sees exactly what the model received)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answers = [
            part.content
            for message in messages
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if answers:
            return ModelResponse(parts=[TextPart(json.dumps(answers[-1]))])
        # A fixed call id, as a model replaying the same turn would give.
        call = ToolCallPart("refund-order-v2", REFUND, tool_call_id="call_refund_1")
        return ModelResponse(parts=[call])

    return FunctionModel(respond)


def save(path: Path, saved: dict[str, Any]) -> None:
    """Write the whole file or nothing: a kill mid-write must not leave half a state."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(saved))
    partial.replace(path)


async def refund(url: str, api_key: str, state_path: Path, wait_s: float) -> str:
    saved = json.loads(state_path.read_text()) if state_path.exists() else {}
    if not saved:
        # The conversation's id: the run is found again by it after a restart.
        saved = {"thread": f"pyd-{uuid.uuid4().hex[:12]}", "history": None, "requests": None}
        save(state_path, saved)
    async with AsyncCountersign(url, api_key) as cs:
        run = await cs.start_run("Refund order-003 (Pydantic AI)", external_ref=saved["thread"])
        toolset = CountersignToolset(cs, run, capabilities=["refund-order-v2"], wait_s=wait_s)
        agent = Agent(scripted_model(), toolsets=[toolset], output_type=[str, DeferredToolRequests])
        if saved["history"]:
            history = ModelMessagesTypeAdapter.validate_json(saved["history"])
            requests = REQUESTS.validate_json(saved["requests"])
        else:
            result = await agent.run("The customer was charged twice for order-003.")
            if not isinstance(result.output, DeferredToolRequests):
                return result.output
            history, requests = result.all_messages(), result.output
            save(
                state_path,
                {
                    **saved,
                    "history": ModelMessagesTypeAdapter.dump_json(history).decode(),
                    "requests": REQUESTS.dump_json(requests).decode(),
                },
            )
        print(f"parked: waiting for approval in run {run['run_id']}", flush=True)
        results = await deferred_results(cs, requests, wait=20)
        while requests.remaining(results) is not None:
            results = await deferred_results(cs, requests, wait=20)
        result = await agent.run(message_history=history, deferred_tool_results=results)
        return str(result.output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, default=Path("var/pydantic-ai-refund.json"))
    parser.add_argument("--url", default=os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--wait", type=float, default=3.0, help="seconds a tool waits first")
    options = parser.parse_args()
    api_key = os.environ.get("COUNTERSIGN_API_KEY")
    if not api_key:
        sys.exit("Set COUNTERSIGN_API_KEY (an admin makes one on the console's People page).")
    options.state.parent.mkdir(parents=True, exist_ok=True)
    answer = asyncio.run(refund(options.url, api_key, options.state, options.wait))
    print(f"model received: {answer}", flush=True)


if __name__ == "__main__":
    main()
