"""Countersign for the OpenAI Agents SDK (`pip install "./client[openai-agents]"`, pinned to
openai-agents 0.24.0). Countersign executes; the SDK only parks and resumes the agent.

    from countersign import AsyncCountersign
    from countersign.openai_agents import countersign_tools, apply_decisions

    cs = AsyncCountersign(url, api_key)
    run = await cs.start_run("Refund order-003", external_ref=thread_id)
    tools = countersign_tools(cs, run, capabilities=["refund-order-v2"], interrupt=True)
    agent = Agent(name="refunds", model=..., tools=tools)
    result = await Runner.run(agent, "Refund order-003")
    if result.interruptions:                       # a person must approve first
        saved = result.to_state().to_json()        # keep it anywhere; the process may die
        ...
        state = await RunState.from_json(agent, saved)
        if not await apply_decisions(cs, run, state, wait=30):   # all decided
            result = await Runner.run(agent, state)

Each capability becomes a function tool whose body proposes with the intent
`run_id:tool_call_id` (so a resumed or replayed tool gets the same call back, never a second
one) and waits for its outcome; the model reads Countersign's answer: status, result,
`executed_args` and `edited` (what actually ran, after an approver's edit) and who decided.

Two ways to wait for people:
- `interrupt=False` (the default): the tool waits up to `wait_s`; if people have not decided
  by then, the model reads a pending answer that tells it not to issue the call again.
- `interrupt=True`: the SDK's own interruptions. `needs_approval` asks Countersign's policy
  dry run; when it says a person must decide, the call is proposed (the approval opens in
  the console) and the run stops with an interruption. The paused `RunState` serialises
  (`to_json`). When the `approval.decided` webhook arrives, or on a timer, `apply_decisions`
  reads each interrupted call from Countersign and approves or rejects it in the state (a
  rejection carries the approver's reason); `Runner.run(agent, state)` then runs the tool,
  which finds the approved call and returns what ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, get_args

from agents import FunctionTool, RunContextWrapper, RunState
from agents.items import ToolApprovalItem
from agents.tool_context import ToolContext

from countersign import _framework
from countersign._core import CountersignError
from countersign.types import Status, ToolCall

__all__ = ["apply_decisions", "countersign_tools"]


def countersign_tools(
    client: Any,
    run: str | dict[str, Any],
    *,
    capabilities: Iterable[str | dict[str, Any]],
    interrupt: bool = False,
    wait_s: float = 20.0,
) -> list[FunctionTool]:
    """One function tool per capability (ids, or descriptions from `client.capabilities()`),
    named by the capability's id, its parameters the capability's input schema. `client` is
    an `AsyncCountersign` (or a `Countersign`, called in a thread); `run` a run or its id."""
    run_id = _framework.run_id_of(run)
    return [
        _tool(client, run_id, spec, interrupt=interrupt, wait_s=wait_s)
        for spec in _framework.tool_specs(client, capabilities)
    ]


def _tool(
    client: Any, run_id: str, spec: dict[str, Any], *, interrupt: bool, wait_s: float
) -> FunctionTool:
    capability = spec["id"]

    async def invoke(ctx: ToolContext[Any], raw_args: str) -> str:
        args = json.loads(raw_args or "{}")
        intent = _framework.intent_for(run_id, ctx.tool_call_id)
        try:
            call = await _framework.call(client, "propose", run_id, capability, args, intent=intent)
            call = await _framework.call(client, "wait", call["tool_call_id"], timeout=wait_s)
        except CountersignError as exc:
            # The model can act on a refusal (fix its arguments); it must not see a crash.
            return json.dumps({"status": "refused", "error": exc.name, "message": exc.message})
        return json.dumps(_framework.for_the_model(call))

    async def needs_approval(_ctx: RunContextWrapper[Any], args: dict[str, Any], call_id: str):
        try:
            evaluation = await _framework.call(client, "evaluate_policy", capability, args)
            if not evaluation["needs_approval"]:
                return False
            # The approval must exist for a person to decide it: propose now, the tool's
            # body finds the same call when the run resumes.
            intent = _framework.intent_for(run_id, call_id)
            call = await _framework.call(client, "propose", run_id, capability, args, intent=intent)
        except CountersignError:
            return False  # the body proposes again and tells the model what was wrong
        return call["status"] == _framework.WAITING

    return FunctionTool(
        name=capability,
        description=_framework.description(spec),
        params_json_schema=spec["input_schema"],
        on_invoke_tool=invoke,
        # The contract's schema is the truth (Countersign checks it again); strict mode would
        # rewrite it.
        strict_json_schema=False,
        needs_approval=needs_approval if interrupt else False,
    )


async def apply_decisions(
    client: Any,
    run: str | dict[str, Any],
    state: RunState,
    *,
    wait: float = 0,
    tools: Iterable[FunctionTool] | None = None,
) -> list[ToolApprovalItem]:
    """Approve or reject, in `state`, each interruption whose call people have decided in
    Countersign (waiting up to `wait` seconds for each), and return those still waiting. An
    empty list: `Runner.run(agent, state)` continues the run. Call it when the
    `approval.decided` webhook arrives (verify it with `countersign.verify_webhook`) or on a
    timer; it writes nothing to Countersign. When the agent has other tools that ask for
    approval, pass `tools` (those of `countersign_tools`): the other interruptions are left
    alone, for their own approvers."""
    run_id = _framework.run_id_of(run)
    ours = {tool.name for tool in tools} if tools is not None else None
    waiting = []
    for item in state.get_interruptions():
        if ours is not None and item.name not in ours:
            continue
        call = await _interrupted_call(client, run_id, item)
        if call["status"] == _framework.WAITING and wait > 0:
            until = frozenset(get_args(Status)) - {_framework.WAITING}
            call = await _framework.call(
                client, "wait", call["tool_call_id"], timeout=wait, until=until
            )
        if call["status"] == _framework.WAITING:
            waiting.append(item)
        elif call["status"] in _framework.REFUSED:
            note = _framework.for_the_model(call)["note"]
            state.reject(item, rejection_message=note)
        else:
            state.approve(item)
    return waiting


async def _interrupted_call(client: Any, run_id: str, item: ToolApprovalItem) -> ToolCall:
    """The call `needs_approval` proposed for this interruption: proposing it again with the
    same intent and arguments answers with the same call (also after an approver's edit)."""
    args = json.loads(item.arguments or "{}")
    intent = _framework.intent_for(run_id, item.call_id or "")
    return await _framework.call(client, "propose", run_id, item.name, args, intent=intent)
