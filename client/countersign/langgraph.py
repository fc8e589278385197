"""LangGraph and LangChain: Countersign executes the tool call; the graph only parks and resumes.

    from countersign.langgraph import CountersignMiddleware, countersign_tools

    agent = create_agent(model, middleware=[CountersignMiddleware(cs, ["refund-order-v2"])],
                         checkpointer=saver)                       # LangChain's create_agent
    graph_tools = ToolNode(countersign_tools(cs, ["refund-order-v2"]))   # a LangGraph graph

A tool call of the model is proposed to Countersign with the key `thread_id:tool_call_id` (the
thread's run is started with `external_ref=thread_id`), then followed for `wait_s` seconds.
Settled in time, the model gets a ToolMessage that says what actually ran (an approver's edit
included) and the whole result envelope as its `artifact`. Otherwise the node calls
`interrupt()` with a payload shaped like LangChain's human-in-the-loop request (and a
`countersign` part: the call's id, status, approval URL, expiry). People decide on the
approval page, never through the resume value: `Command(resume=...)` only makes the node run
again, and the node, proposing the same key again, gets the same call back — never a second
one — and either its outcome or another interrupt. That is the hazard LangGraph's docs warn
about (code before `interrupt()` runs again on resume) made harmless.

Several calls parked in one step are several interrupts: resume them together with
`Command(resume={interrupt.id: {} for interrupt in state["__interrupt__"]})`.

Needs the `langgraph` extra (`pip install "./client[langgraph]"`): imported only when used.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolRuntime
from langgraph.types import interrupt

from countersign.client import Countersign, CountersignError
from countersign.types import TERMINAL, ToolCall

__all__ = [
    "CountersignMiddleware",
    "countersign_tools",
    "intent_for",
    "interrupt_payload",
    "tool_message",
]

# The API's rule for an intent; a key that breaks it is replaced by its digest.
INTENT = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
DEFAULT_WAIT_SECONDS = 20.0


def intent_for(thread_id: str, tool_call_id: str) -> str:
    """The intent (idempotency key) of a model's tool call: `thread_id:tool_call_id`, the same
    every time the node runs again."""
    key = f"{thread_id}:{tool_call_id}"
    if INTENT.match(key):
        return key
    return "lg-" + hashlib.sha256(key.encode()).hexdigest()[:48]


class _Executor:
    """Proposes, follows and reports one capability's calls for a graph."""

    def __init__(self, client: Countersign, capability: str, wait_s: float) -> None:
        self.client = client
        self.capability = capability
        self.wait_s = wait_s
        # thread id -> run id: a run is started once per thread (and idempotently anyway).
        self.runs: dict[str, str] = {}

    def run_for(self, thread_id: str) -> str:
        if thread_id not in self.runs:
            run = self.client.start_run(f"LangGraph thread {thread_id}", external_ref=thread_id)
            self.runs[thread_id] = run["run_id"]
        return self.runs[thread_id]

    def execute(
        self, tool_name: str, args: dict[str, Any], tool_call_id: str, config: RunnableConfig
    ) -> ToolMessage:
        thread_id = str((config.get("configurable") or {}).get("thread_id") or "")
        if not thread_id:
            raise ValueError(
                "Countersign's tools need the graph's thread_id (a checkpointer and "
                "config={'configurable': {'thread_id': ...}}): it is half of the call's key."
            )
        intent = intent_for(thread_id, tool_call_id)
        try:
            call = self.client.propose(
                self.run_for(thread_id), self.capability, args, intent=intent
            )
        except CountersignError as refused:
            if refused.status >= 500 or refused.status == 401:
                raise  # nothing the model can fix: the graph fails and may be run again
            return _refusal(tool_name, tool_call_id, refused)
        if call["status"] not in TERMINAL:
            call = self.client.wait(call["tool_call_id"], timeout=self.wait_s)
        while call["status"] not in TERMINAL:
            # The resume value is not read: people decide in Countersign. Each resume only
            # makes this node look again (a replayed earlier interrupt returns at once).
            interrupt(interrupt_payload(tool_name, call))
            call = self.client.tool_call(call["tool_call_id"])
        return tool_message(tool_name, tool_call_id, call)


def interrupt_payload(tool_name: str, call: ToolCall) -> dict[str, Any]:
    """What the graph's caller sees while the call is not settled: LangChain's HITLRequest
    (`action_requests`, `review_configs`) with no decisions allowed through the graph, and the
    Countersign call to follow."""
    return {
        "action_requests": [
            {"name": tool_name, "args": call["args"], "description": _waiting_for(call)}
        ],
        "review_configs": [{"action_name": tool_name, "allowed_decisions": []}],
        "countersign": {
            "tool_call_id": call["tool_call_id"],
            "run_id": call["run_id"],
            "status": call["status"],
            "approval_url": call["approval_url"],
            "expires_at": call["expires_at"],
            "retry_after_s": call["retry_after_s"],
        },
    }


def _waiting_for(call: ToolCall) -> str:
    if call["status"] == "awaiting_approval":
        approval = call["approval"] or {}
        count = f"{approval.get('approvals', 0)} of {approval.get('required_approvers', 1)}"
        return (
            f"Waiting for approval in Countersign ({count}): {call['approval_url']}. Decide "
            "there; resuming the graph only checks again."
        )
    if call["status"] == "unknown":
        return (
            "The outcome is unknown and Countersign is looking it up: do not send it again. "
            "Resume the graph to check again."
        )
    return "Countersign is executing it. Resume the graph to check again."


def tool_message(tool_name: str, tool_call_id: str, call: ToolCall) -> ToolMessage:
    """The model's answer for a settled call: what ran (after an edit, saying so), or why
    nothing ran. The whole envelope is the message's `artifact`."""
    succeeded = call["status"] == "succeeded"
    return ToolMessage(
        content=_outcome_text(call),
        tool_call_id=tool_call_id,
        name=tool_name,
        status="success" if succeeded else "error",
        artifact=dict(call),
    )


def _refusal(tool_name: str, tool_call_id: str, refused: CountersignError) -> ToolMessage:
    """Arguments Countersign refused (the schema, the business check, a scope): the model may
    correct them. Nothing was proposed."""
    problems = "; ".join(
        f"{p.get('field', '')}: {p.get('problem', p)}" if isinstance(p, dict) else str(p)
        for p in refused.details
    )
    text = f"Countersign refused the call ({refused.name}: {refused.message})."
    return ToolMessage(
        content=f"{text} {problems}".strip() + " Nothing was executed.",
        tool_call_id=tool_call_id,
        name=tool_name,
        status="error",
    )


def _outcome_text(call: ToolCall) -> str:
    decision = call["decision"] or {}
    by = ", ".join(decision.get("by") or []) or "an approver"
    reason = f" (reason: {decision['reason']})" if decision.get("reason") else ""
    status = call["status"]
    if status == "succeeded":
        text = "Countersign: succeeded."
        if call["edited"]:
            text += (
                f" {by} edited the call before it ran{reason}: {_changes(decision)}. What ran "
                f"is not what you asked for: {json.dumps(call['executed_args'], sort_keys=True)}."
            )
        return f"{text} Result: {json.dumps(call['result'], sort_keys=True, default=str)}"
    if status == "rejected":
        return (
            f"Countersign: rejected by {by}{reason}. Nothing was executed. Do not ask again "
            "unless the user says so."
        )
    if status == "failed":
        error = call["last_error"] or {"name": "unknown", "message": ""}
        return f"Countersign: failed ({error['name']}: {error['message']})."
    return f"Countersign: {status}. Nothing was executed."


def _changes(decision: Mapping[str, Any]) -> str:
    changed = []
    for entry in decision.get("decisions") or []:
        for field, change in (entry.get("changes") or {}).items():
            changed.append(f"{field} {change.get('from')!r} -> {change.get('to')!r}")
    return ", ".join(changed) or "arguments changed"


# --- the tool wrapper (LangGraph's ToolNode, create_agent's tools) ------------------------------


def countersign_tools(
    client: Countersign,
    capabilities: Iterable[str],
    *,
    names: Mapping[str, str] | None = None,
    wait_s: float = DEFAULT_WAIT_SECONDS,
) -> list[BaseTool]:
    """One tool per capability id, its input schema the capability's (read from the API once),
    named after the capability unless `names` maps its id to another name."""
    wanted = list(capabilities)
    described = {c["id"]: c for c in client.capabilities() if c["id"] in wanted}
    missing = [c for c in wanted if c not in described]
    if missing:
        raise ValueError(f"Countersign has no capability {', '.join(missing)}")
    return [_tool(client, described[c], (names or {}).get(c, c), wait_s) for c in wanted]


def _tool(client: Countersign, capability: dict[str, Any], name: str, wait_s: float) -> BaseTool:
    executor = _Executor(client, capability["id"], wait_s)

    # ToolNode injects `runtime` (the call's id and the graph's config); the model never sees it.
    def propose_and_wait(runtime: ToolRuntime, **args: Any) -> ToolMessage:
        return executor.execute(name, args, runtime.tool_call_id, runtime.config)

    schema = {k: v for k, v in capability["input_schema"].items() if k != "examples"}
    reversible = "reversible" if capability["reversible"] else "irreversible"
    tool = StructuredTool.from_function(
        func=propose_and_wait,
        name=name,
        description=f"{capability['title']} (executed by Countersign, exactly once; "
        f"risk {capability['risk']}, {reversible}).",
        args_schema=schema,
    )
    tool.metadata = {"countersign_capability": capability["id"]}
    return tool


# --- the middleware (LangChain's create_agent) -------------------------------------------------


class CountersignMiddleware(AgentMiddleware):
    """Hand tool calls to Countersign in `create_agent`. `capabilities` adds one tool per
    capability; `route` sends the agent's own tools (by name) to a capability instead of
    running their bodies: `route={"refund_order": "refund-order-v2"}`."""

    def __init__(
        self,
        client: Countersign,
        capabilities: Sequence[str] = (),
        *,
        route: Mapping[str, str] | None = None,
        wait_s: float = DEFAULT_WAIT_SECONDS,
    ) -> None:
        super().__init__()
        self.tools = countersign_tools(client, capabilities, wait_s=wait_s) if capabilities else []
        capability_of = {t.name: t.metadata["countersign_capability"] for t in self.tools}
        capability_of.update(route or {})
        self.executors = {
            name: _Executor(client, capability, wait_s)
            for name, capability in capability_of.items()
        }

    def wrap_tool_call(self, request: Any, handler: Any) -> ToolMessage:
        executor = self.executors.get(request.tool_call["name"])
        if executor is None:
            return handler(request)
        call = request.tool_call
        return executor.execute(call["name"], call["args"], call["id"], request.runtime.config)

    async def awrap_tool_call(self, request: Any, handler: Any) -> ToolMessage:
        if request.tool_call["name"] not in self.executors:
            return await handler(request)
        # The client is synchronous; the thread gets a copy of the context, so interrupt()
        # still finds the graph's config there.
        return await asyncio.to_thread(self.wrap_tool_call, request, handler)
