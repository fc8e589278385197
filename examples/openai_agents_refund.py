"""An OpenAI Agents SDK agent whose refund Countersign executes, with the SDK's own
interruptions for the approval (countersign/openai_agents.py).

    export COUNTERSIGN_URL=http://127.0.0.1:8000 COUNTERSIGN_API_KEY=cs_...
    python examples/openai_agents_refund.py --state var/oai-refund.json

The model is scripted (no LLM, no network): it asks to refund $250 of order-003, over the
$200 a person must approve, so the run stops with an interruption. The agent saves the paused
`RunState` to `--state`, then polls Countersign until the approval is decided in the console
(approve, reject, or approve with an edit), resumes, and prints what the model received: what
actually ran. Kill it while it waits and start it again with the same `--state`: it carries on
from the saved state, and the refund still happens once.

For a real model, replace `ScriptedRefundModel()` with a model name ("gpt-4.1").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, Runner, RunState, Usage, set_tracing_disabled
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from countersign import AsyncCountersign
from countersign.openai_agents import apply_decisions, countersign_tools

REFUND = {
    "order_id": "order-003",
    "amount_cents": 25000,
    "currency": "USD",
    "reason": "duplicate charge",
}


class ScriptedRefundModel(Model):
    """Asks for the refund; once it has the tool's answer, repeats it as its final answer
    (so whoever runs the agent sees exactly what the model received)."""

    async def get_response(self, system_instructions, input, *args: Any, **kwargs: Any):
        answers = [
            item["output"]
            for item in (input if isinstance(input, list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if answers:
            output = [assistant_message(str(answers[-1]))]
        else:
            # A fixed call id, as a model replaying the same turn would give.
            output = [function_call("refund-order-v2", REFUND, call_id="call_refund_1")]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def save(path: Path, saved: dict[str, Any]) -> None:
    """Write the whole file or nothing: a kill mid-write must not leave half a state."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(saved))
    partial.replace(path)


async def refund(url: str, api_key: str, state_path: Path) -> str:
    saved = json.loads(state_path.read_text()) if state_path.exists() else {}
    if not saved:
        # The conversation's id: the run is found again by it after a restart.
        saved = {"thread": f"oai-{uuid.uuid4().hex[:12]}", "run_state": None}
        save(state_path, saved)
    async with AsyncCountersign(url, api_key) as cs:
        run = await cs.start_run(
            "Refund order-003 (OpenAI Agents SDK)", external_ref=saved["thread"]
        )
        tools = countersign_tools(cs, run, capabilities=["refund-order-v2"], interrupt=True)
        agent = Agent(name="refunds", model=ScriptedRefundModel(), tools=tools)
        if saved["run_state"]:
            state = await RunState.from_string(agent, saved["run_state"])
        else:
            result = await Runner.run(agent, "The customer was charged twice for order-003.")
            if not result.interruptions:
                return str(result.final_output)
            state = result.to_state()
            save(state_path, {**saved, "run_state": state.to_string()})
        print(f"parked: waiting for approval in run {run['run_id']}", flush=True)
        while await apply_decisions(cs, run, state, wait=20):
            pass
        result = await Runner.run(agent, state)
        return str(result.final_output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, default=Path("var/oai-refund.json"))
    parser.add_argument("--url", default=os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8000"))
    options = parser.parse_args()
    api_key = os.environ.get("COUNTERSIGN_API_KEY")
    if not api_key:
        sys.exit("Set COUNTERSIGN_API_KEY (an admin makes one on the console's People page).")
    set_tracing_disabled(True)  # the SDK would send traces to OpenAI
    options.state.parent.mkdir(parents=True, exist_ok=True)
    answer = asyncio.run(refund(options.url, api_key, options.state))
    print(f"model received: {answer}", flush=True)


if __name__ == "__main__":
    main()
