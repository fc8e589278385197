"""The asynchronous client: the same calls as `Countersign`, awaited.

    from countersign import AsyncCountersign
    async with AsyncCountersign("http://127.0.0.1:8000", api_key) as cs:
        run = await cs.start_run("Refund order-001", external_ref=thread_id)
        call = await cs.propose(run["run_id"], "refund-order-v2", args, intent=tool_call_id)
        call = await cs.wait(call["tool_call_id"], timeout=60)

It depends on httpx only. Retries are described in countersign/_core.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import httpx

from countersign import _core
from countersign._core import Request
from countersign.types import TERMINAL, Decision, PolicyEvaluation, Run, ToolCall

__all__ = ["AsyncCountersign"]


class AsyncCountersign:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.max_retries = max_retries
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + _core.API_PREFIX,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncCountersign:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _send(self, request: Request) -> Any:
        attempt = 0
        while True:
            try:
                response = await self.http.request(
                    request.method,
                    request.path,
                    json=request.json,
                    params=request.params,
                    headers=request.headers,
                    timeout=request.timeout or self.http.timeout,
                )
            except httpx.TransportError as exc:
                delay = _core.delay_after_error(exc, request, attempt, self.max_retries)
                if delay is None:
                    raise
            else:
                delay = _core.delay_after_response(response, attempt, self.max_retries)
                if delay is None:
                    return _core.result_of(response)
            await asyncio.sleep(delay)
            attempt += 1

    # --- runs and decisions -------------------------------------------------------------

    async def start_run(
        self,
        title: str,
        *,
        idempotency_key: str | None = None,
        external_ref: str | None = None,
        **fields: Any,
    ) -> Run:
        """Start a run (`correlation_id`, `max_tool_calls`, `deadline`, `metadata` …). With an
        `external_ref` (the framework's thread id) starting it again returns the same run."""
        request = _core.start_run(
            title, idempotency_key=idempotency_key, external_ref=external_ref, fields=fields
        )
        return cast(Run, await self._send(request))

    async def get_run(self, run_id: str) -> Run:
        return cast(Run, await self._send(Request("GET", f"/runs/{run_id}")))

    async def record_decision(
        self,
        run_id: str,
        kind: str,
        content: dict[str, Any],
        supersedes: str | None = None,
        turn_id: str = "",
    ) -> Decision:
        request = _core.record_decision(run_id, kind, content, supersedes, turn_id)
        return cast(Decision, await self._send(request))

    async def stop_run(self, run_id: str, reason: str = "") -> Run:
        return cast(
            Run, await self._send(Request("POST", f"/runs/{run_id}/stop", {"reason": reason}))
        )

    async def finish_run(
        self, run_id: str, *, failed_permanently: bool = False, reason: str = ""
    ) -> Run:
        return cast(Run, await self._send(_core.finish_run(run_id, failed_permanently, reason)))

    async def mint_credential(
        self, run_id: str, ttl_s: int, scopes: list[str] | None = None
    ) -> dict[str, Any]:
        """See Countersign.mint_credential: a bearer token for this run only."""
        return await self._send(_core.mint_credential(run_id, ttl_s, scopes))

    async def resume(self, run_id: str) -> dict[str, Any]:
        """See Countersign.resume: what a fresh agent needs to continue the run."""
        return await self._send(Request("GET", f"/runs/{run_id}/resume"))

    async def progress(self, run_id: str) -> dict[str, Any]:
        return await self._send(Request("GET", f"/runs/{run_id}/progress"))

    async def capabilities(self) -> list[dict[str, Any]]:
        return await self._send(Request("GET", "/capabilities"))

    # --- tool calls ---------------------------------------------------------------------

    async def evaluate_policy(self, capability: str, args: dict[str, Any]) -> PolicyEvaluation:
        """Would these arguments need approval now, by which rule, from how many people?
        Writes nothing."""
        body = {"capability": capability, "args": args}
        return cast(PolicyEvaluation, await self._send(Request("POST", "/policy/evaluate", body)))

    async def propose(
        self,
        run_id: str,
        capability: str,
        args: dict[str, Any],
        *,
        intent: str,
        decision_id: str | None = None,
        object_ref: str = "",
        object_revision: int | None = None,
        depends_on: list[str] | None = None,
    ) -> ToolCall:
        """Propose a side effect. Safe to repeat: the same intent (the framework's tool-call
        id) and args give the same call back."""
        request = _core.propose(
            run_id,
            capability,
            args,
            intent=intent,
            decision_id=decision_id,
            object_ref=object_ref,
            object_revision=object_revision,
            depends_on=depends_on,
        )
        return cast(ToolCall, await self._send(request))

    async def tool_call(self, tool_call_id: str, wait: float = 0, since: str = "") -> ToolCall:
        """Read a call; with `wait` (seconds, at most 30), answer as soon as it changes after
        `since` (the `updated_at` last seen)."""
        return cast(ToolCall, await self._send(_core.get_tool_call(tool_call_id, wait, since)))

    async def wait(
        self, tool_call_id: str, timeout: float = 60, *, until: frozenset[str] = TERMINAL
    ) -> ToolCall:
        """Follow a call with long polls until its status is in `until` (a terminal one) or
        `timeout` seconds pass, and return it as it is then (look at `status`)."""
        deadline = time.monotonic() + timeout
        call = await self.tool_call(tool_call_id)
        while call["status"] not in until:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            call = await self.tool_call(tool_call_id, wait=left, since=call["updated_at"])
        return call

    async def cancel(self, tool_call_id: str, reason: str = "") -> ToolCall:
        """Cancel a call before it is dispatched; after, CountersignError
        `tool_call.already_dispatched` (its outcome is still recorded)."""
        body = {"reason": reason}
        return cast(
            ToolCall, await self._send(Request("POST", f"/tool-calls/{tool_call_id}/cancel", body))
        )

    async def retry(self, tool_call_id: str) -> ToolCall:
        return cast(ToolCall, await self._send(_core.retry(tool_call_id)))

    async def reconcile(self, tool_call_id: str) -> ToolCall:
        return cast(
            ToolCall, await self._send(Request("POST", f"/tool-calls/{tool_call_id}/reconcile"))
        )

    async def compensate(self, tool_call_id: str) -> ToolCall:
        path = f"/tool-calls/{tool_call_id}/compensate"
        return cast(ToolCall, await self._send(Request("POST", path)))
