"""What the framework adapters share (countersign/openai_agents.py, countersign/pydantic_ai.py):
the intent made from the framework's own tool-call id, the tools' specs from the capabilities'
contracts, what the model is told about a call, and calling either client from async code.

The rule of every adapter: Countersign executes; the framework only parks and resumes the
agent. A tool's body proposes (the same intent gives the same call back, so a replayed or
resumed tool never makes a second one) and waits; it never performs the side effect itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import re
from collections.abc import Iterable
from typing import Any

import httpx

from countersign import _core
from countersign.types import ToolCall

# The API's pattern for an intent, and its length.
_NOT_IN_INTENT = re.compile(r"[^A-Za-z0-9._:-]")
_MAX_INTENT = 200

# Statuses after people decided (or the call never needed them): anything but waiting.
WAITING = "awaiting_approval"
REFUSED = frozenset({"rejected", "expired", "cancelled"})


def intent_for(scope: str, tool_call_id: str) -> str:
    """`scope:tool_call_id` (scope: the run, or the framework's thread), as the API accepts
    it. A model's call ids repeat across conversations, hence the scope; ids with other
    characters, or too long, keep a digest of the original so two never share an intent."""
    intent = f"{scope}:{tool_call_id}"
    safe = _NOT_IN_INTENT.sub("-", intent)
    if safe == intent and len(intent) <= _MAX_INTENT:
        return intent
    return f"{safe[:150]}-{hashlib.sha256(intent.encode()).hexdigest()[:32]}"


def run_id_of(run: str | dict[str, Any]) -> str:
    return run if isinstance(run, str) else run["run_id"]


def tool_specs(client: Any, capabilities: Iterable[str | dict[str, Any]]) -> list[dict[str, Any]]:
    """The contracts of `capabilities` (ids, or descriptions from `client.capabilities()`):
    each with `id`, `title`, `kind`, `risk` and `input_schema`."""
    wanted = list(capabilities)
    ids = [c for c in wanted if isinstance(c, str)]
    known = {c["id"]: c for c in _describe(client)} if ids else {}
    missing = [c for c in ids if c not in known]
    if missing:
        raise ValueError(f"Countersign has no capability {', '.join(missing)}")
    return [known[c] if isinstance(c, str) else c for c in wanted]


def _describe(client: Any) -> list[dict[str, Any]]:
    if not inspect.iscoroutinefunction(client.capabilities):
        return client.capabilities()
    # Building tools is synchronous in both frameworks: one plain GET with the async
    # client's own address and key.
    http = client.http
    url = str(http.base_url).rstrip("/") + "/capabilities"
    response = httpx.get(url, headers=dict(http.headers), timeout=30)
    return _core.result_of(response)


def description(spec: dict[str, Any]) -> str:
    kind = "changes the outside world" if spec.get("kind") == "write" else "reads"
    return (
        f"{spec.get('title', spec['id'])} ({kind}; risk {spec.get('risk', 'unknown')}). "
        "Countersign runs it exactly once and may ask a person to approve it first; the "
        "answer says what actually ran."
    )


async def call(client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """`client.method(...)` for the async client, or the sync one in a thread."""
    function = getattr(client, method)
    if inspect.iscoroutinefunction(function):
        return await function(*args, **kwargs)
    return await asyncio.to_thread(function, *args, **kwargs)


def for_the_model(call: ToolCall) -> dict[str, Any]:
    """What the model reads about a call: the envelope's fields and what to do next."""
    decision = call.get("decision") or None
    answer: dict[str, Any] = {
        "tool_call_id": call["tool_call_id"],
        "status": call["status"],
        "result": call.get("result"),
        "executed_args": call.get("executed_args"),
        "edited": call.get("edited", False),
    }
    if decision:
        answer["decision"] = {k: decision.get(k) for k in ("outcome", "by", "reason")}
    answer["note"] = _note(call)
    return answer


def _note(call: ToolCall) -> str:
    status = call["status"]
    if status == "succeeded":
        if call.get("edited"):
            return "Done, with the arguments the approver set (executed_args), not yours."
        return "Done."
    if status == WAITING:
        return (
            f"Waiting for a person's approval at {call.get('approval_url')}. Do not issue "
            "this call again; it runs once approved."
        )
    if status == "unknown":
        return "The outcome is unknown and Countersign is reconciling it. Do not retry."
    if status == "running":
        return "Approved or allowed, and still running. Do not issue this call again."
    if status in REFUSED:
        decision = call.get("decision") or {}
        reason = decision.get("reason") or ""
        return f"Not done: {status}{' (' + reason + ')' if reason else ''}. Do not retry."
    error = call.get("last_error") or {}
    return f"Not done: {status} {error.get('name', '')} {error.get('message', '')}".strip()
