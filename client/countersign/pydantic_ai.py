"""Countersign for Pydantic AI (`pip install "./client[pydantic-ai]"`, pinned to
pydantic-ai-slim 2.68.0). Countersign executes; Pydantic AI only parks and resumes the agent.

    from countersign import AsyncCountersign
    from countersign.pydantic_ai import CountersignToolset, deferred_results

    cs = AsyncCountersign(url, api_key)
    run = await cs.start_run("Refund order-003", external_ref=thread_id)
    toolset = CountersignToolset(cs, run, capabilities=["refund-order-v2"], wait_s=20)
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    result = await agent.run("Refund order-003")
    if isinstance(result.output, DeferredToolRequests):   # parked: a person must decide
        history, requests = result.all_messages(), result.output    # keep both anywhere
        ...
        results = await deferred_results(cs, requests, wait=30)
        if requests.remaining(results) is None:                     # all decided and done
            result = await agent.run(message_history=history, deferred_tool_results=results)

Each capability becomes a tool whose body proposes with the intent `run_id:tool_call_id` (the
same model call gives the same Countersign call back, never a second one) and waits up to
`wait_s` for the outcome. When people have not decided by then, it raises `CallDeferred` with
the Countersign call's id in the metadata, so the run ends with `DeferredToolRequests` and
the process may stop. `deferred_results` reads those calls from Countersign (when the
`approval.decided` or `tool_call.terminal` webhook arrives, or on a timer) and turns each
that has finished into a `DeferredToolResults` entry: the model then reads Countersign's
answer — status, result, `executed_args` and `edited` (what actually ran, after an approver's
edit) and who decided. A call rejected or expired is answered too, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_ai import (
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    RunContext,
    Tool,
)
from pydantic_ai.toolsets import FunctionToolset

from countersign import _framework
from countersign._core import CountersignError
from countersign.types import TERMINAL

__all__ = ["CALL_ID", "CountersignToolset", "deferred_results"]

# The key of the Countersign call's id in a deferred call's metadata.
CALL_ID = "countersign_tool_call_id"


class CountersignToolset(FunctionToolset[Any]):
    """One tool per capability (ids, or descriptions from `client.capabilities()`), named by
    the capability's id, its parameters the capability's input schema. `client` is an
    `AsyncCountersign` (or a `Countersign`, called in a thread); `run` a run or its id."""

    def __init__(
        self,
        client: Any,
        run: str | dict[str, Any],
        *,
        capabilities: Iterable[str | dict[str, Any]],
        wait_s: float = 20.0,
        id: str = "countersign",
    ) -> None:
        run_id = _framework.run_id_of(run)
        specs = _framework.tool_specs(client, capabilities)
        super().__init__([_tool(client, run_id, spec, wait_s) for spec in specs], id=id)


def _tool(client: Any, run_id: str, spec: dict[str, Any], wait_s: float) -> Tool[Any]:
    capability = spec["id"]

    async def propose_and_wait(ctx: RunContext[Any], **args: Any) -> dict[str, Any]:
        intent = _framework.intent_for(run_id, ctx.tool_call_id or "")
        try:
            call = await _framework.call(client, "propose", run_id, capability, args, intent=intent)
            call = await _framework.call(client, "wait", call["tool_call_id"], timeout=wait_s)
        except CountersignError as exc:
            # Refused before anything ran (bad arguments, a closed run): the model may fix it.
            raise ModelRetry(f"Countersign refused the call: {exc.name}: {exc.message}") from exc
        if call["status"] not in TERMINAL:
            raise CallDeferred(
                metadata={
                    CALL_ID: call["tool_call_id"],
                    "status": call["status"],
                    "approval_url": call.get("approval_url"),
                }
            )
        return _framework.for_the_model(call)

    return Tool.from_schema(
        propose_and_wait,
        name=capability,
        description=_framework.description(spec),
        json_schema=spec["input_schema"],
        takes_ctx=True,
    )


async def deferred_results(
    client: Any, requests: DeferredToolRequests, *, wait: float = 0
) -> DeferredToolResults:
    """The deferred calls that have finished in Countersign (waiting up to `wait` seconds for
    each), as results for the next run: what the model reads is Countersign's answer. Calls
    still waiting are left out; `requests.remaining(results)` lists them. Writes nothing."""
    results = DeferredToolResults()
    for part in requests.calls:
        countersign_id = requests.metadata.get(part.tool_call_id, {}).get(CALL_ID)
        if countersign_id is None:
            continue  # another toolset's deferred call
        call = await _framework.call(client, "wait", countersign_id, timeout=wait)
        if call["status"] in TERMINAL:
            results.calls[part.tool_call_id] = _framework.for_the_model(call)
    return results
