"""What the MCP server (countersign/mcp_server.py) tells a model, as plain functions of the
API's answers: the intent a tool call is proposed under, a tool's annotations from its
contract, and the text of an outcome. No `mcp` import: the texts are tested on their own.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from countersign.types import ToolCall

# Where a host may put its own idempotency key in a request's `_meta`, in order of preference.
META_KEYS = ("io.countersign/idempotency-key", "idempotency_key", "idempotencyKey")
# What the API takes as an intent (README, "The intent is the framework's own tool-call id").
INTENT = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def canonical_json(value: Any) -> str:
    """One spelling per value: the same arguments in another key order are the same call."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def intent_for(meta: dict[str, Any] | None, run_id: str, tool: str, args: dict[str, Any]) -> str:
    """The intent to propose under. The host's key when its `_meta` carries one (so a host
    that retries a request after a lost answer gets the same call back); otherwise derived from
    the run, the tool and the canonical arguments, so the model asking again for the same
    thing in the same run gets the same call, never a second refund."""
    for name in META_KEYS:
        value = (meta or {}).get(name)
        if isinstance(value, str | int) and str(value):
            key = str(value)
            # The API takes a restricted alphabet; any other key still names one intent.
            return key if INTENT.fullmatch(key) else f"mcp-meta:{_digest(key)}"
    return f"mcp:{_digest(canonical_json([run_id, tool, args]))}"


def annotations_of(capability: dict[str, Any]) -> dict[str, Any]:
    """MCP tool annotations from a capability's contract (GET /api/v1/capabilities)."""
    read = capability["kind"] == "read"
    return {
        "title": capability["title"],
        "read_only_hint": read,
        # A write that cannot be undone (a refund, an e-mail) destroys; one with a
        # compensating capability (a reservation, a waybill) only adds.
        "destructive_hint": not read and not capability["reversible"],
        # The same arguments in the same run are the same intent: Countersign executes it
        # at most once, however often the model calls.
        "idempotent_hint": True,
        # Every capability acts on an external system (payments, warehouse, carrier, mailer).
        "open_world_hint": True,
    }


def describe(capability: dict[str, Any]) -> str:
    kind = "reads from" if capability["kind"] == "read" else "writes to"
    undo = " It cannot be undone." if capability["irreversible"] else ""
    return (
        f"{capability['title']} ({capability['id']}: {kind} {capability['system']}, risk "
        f"{capability['risk']}).{undo} Countersign checks the arguments against its contract, "
        "asks a human approver when policy says so, and executes it at most once. The answer "
        "says whether it ran, was refused, or is still waiting; while it waits, do not call "
        "this tool again for the same thing: check it with countersign_status."
    )


# --- outcomes -------------------------------------------------------------------------------


def handle(call: ToolCall) -> dict[str, Any]:
    """The structured part of every answer: the result envelope, under `call_id`."""
    return {
        "call_id": call["tool_call_id"],
        "capability": call["capability"],
        "status": call["status"],
        "result": call["result"],
        "executed_args": call["executed_args"],
        "edited": call["edited"],
        "decision": call["decision"],
        "approval_url": call["approval_url"],
        "expires_at": call["expires_at"],
        "retry_after_s": call["retry_after_s"],
    }


def waiting_message(call: ToolCall) -> str:
    """The progress notification's message while a call waits."""
    approval = call.get("approval")
    if call["status"] == "awaiting_approval" and approval:
        return f"waiting for approval, {approval['approvals']} of {approval['required_approvers']}"
    if call["status"] == "unknown":
        return "outcome unknown, being reconciled"
    return call["status"]


def _check_status(call_id: str) -> str:
    return f'countersign_status(call_id="{call_id}")'


def _who(call: ToolCall) -> str:
    decision = call["decision"] or {}
    return ", ".join(decision.get("by") or []) or "an approver"


def _succeeded(call: ToolCall) -> str:
    text = (
        f"Done: {call['capability']} succeeded (call {call['tool_call_id']}). "
        f"Result: {canonical_json(call['result'])}."
    )
    if call["edited"]:
        text += (
            f" {_who(call)} changed the arguments before it ran; what actually ran: "
            f"{canonical_json(call['executed_args'])}. Report these, not the ones you asked for."
        )
    return text


def _rejected(call: ToolCall) -> str:
    reason = (call["decision"] or {}).get("reason") or "no reason given"
    return (
        f"Rejected by {_who(call)}: {reason}. {call['capability']} was not executed "
        f"(call {call['tool_call_id']}). Do not issue it again unchanged."
    )


def _failed(call: ToolCall) -> str:
    error = call.get("last_error") or {"name": "failed", "message": ""}
    why = f"{error['name']}: {error['message']}" if error["message"] else error["name"]
    return f"Failed: {call['capability']} did not succeed (call {call['tool_call_id']}): {why}."


def _expired(call: ToolCall) -> str:
    return (
        f"Expired: no approver decided in time, so {call['capability']} was not executed "
        f"(call {call['tool_call_id']})."
    )


def _cancelled(call: ToolCall) -> str:
    return f"Cancelled: {call['capability']} was not executed (call {call['tool_call_id']})."


def _unknown(call: ToolCall) -> str:
    return (
        f"Outcome unknown: {call['capability']} may or may not have taken effect "
        f"(call {call['tool_call_id']}). Do not retry; being reconciled: Countersign is "
        f"looking the outcome up at the external system, or a person owns it. Check it with "
        f"{_check_status(call['tool_call_id'])}."
    )


def _pending(call: ToolCall) -> str:
    call_id = call["tool_call_id"]
    if call["status"] == "awaiting_approval":
        state = f"{waiting_message(call)}."
        if call["approval_url"]:
            state += f" An approver decides at {call['approval_url']}"
            state += f", before {call['expires_at']}." if call["expires_at"] else "."
    else:
        state = "accepted and on its way."
    return (
        f"Pending: {call['capability']} (call {call_id}) is {state} Do not re-issue this "
        f"call: it is recorded and will run at most once. Check its status with "
        f'countersign_status(call_id="{call_id}", wait_s=20).'
    )


OUTCOMES = {
    "succeeded": (_succeeded, False),
    "rejected": (_rejected, True),
    "failed": (_failed, True),
    "expired": (_expired, True),
    "cancelled": (_cancelled, True),
    "unknown": (_unknown, False),
}


def outcome_text(call: ToolCall) -> tuple[str, bool]:
    """What the model reads about `call` as it is now, and whether it is an error."""
    render, is_error = OUTCOMES.get(call["status"], (_pending, False))
    return render(call), is_error
