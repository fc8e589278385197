"""The synchronous client: the common path of an agent is one call each.

    from countersign import Countersign
    cs = Countersign("http://127.0.0.1:8000", api_key)
    run = cs.start_run("Refund order-001", external_ref=thread_id)
    call = cs.propose(run["run_id"], "refund-order-v2", args, intent=tool_call_id)
    call = cs.wait(call["tool_call_id"], timeout=60)   # call["status"] says what to do next

It depends on httpx only. Retries are described in countersign/_core.py.
"""

from __future__ import annotations

import time
from typing import Any, cast

import httpx

from countersign import _core
from countersign._core import CountersignError, Request
from countersign.types import TERMINAL, Decision, PolicyEvaluation, Run, ToolCall

__all__ = ["Countersign", "CountersignError"]


class Countersign:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.max_retries = max_retries
        self.http = httpx.Client(
            base_url=base_url.rstrip("/") + _core.API_PREFIX,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Countersign:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _send(self, request: Request) -> Any:
        attempt = 0
        while True:
            try:
                response = self.http.request(
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
            time.sleep(delay)
            attempt += 1

    # --- runs and decisions -------------------------------------------------------------

    def start_run(
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
        return cast(Run, self._send(request))

    def get_run(self, run_id: str) -> Run:
        return cast(Run, self._send(Request("GET", f"/runs/{run_id}")))

    def record_decision(
        self,
        run_id: str,
        kind: str,
        content: dict[str, Any],
        supersedes: str | None = None,
        turn_id: str = "",
    ) -> Decision:
        request = _core.record_decision(run_id, kind, content, supersedes, turn_id)
        return cast(Decision, self._send(request))

    def stop_run(self, run_id: str, reason: str = "") -> Run:
        return cast(Run, self._send(Request("POST", f"/runs/{run_id}/stop", {"reason": reason})))

    def finish_run(self, run_id: str, *, failed_permanently: bool = False, reason: str = "") -> Run:
        return cast(Run, self._send(_core.finish_run(run_id, failed_permanently, reason)))

    def progress(self, run_id: str) -> dict[str, Any]:
        return self._send(Request("GET", f"/runs/{run_id}/progress"))

    def capabilities(self) -> list[dict[str, Any]]:
        return self._send(Request("GET", "/capabilities"))

    # --- tool calls ---------------------------------------------------------------------

    def evaluate_policy(self, capability: str, args: dict[str, Any]) -> PolicyEvaluation:
        """Would these arguments need approval now, by which rule, from how many people?
        Writes nothing."""
        body = {"capability": capability, "args": args}
        return cast(PolicyEvaluation, self._send(Request("POST", "/policy/evaluate", body)))

    def propose(
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
        return cast(ToolCall, self._send(request))

    def tool_call(self, tool_call_id: str, wait: float = 0, since: str = "") -> ToolCall:
        """Read a call; with `wait` (seconds, at most 30), answer as soon as it changes after
        `since` (the `updated_at` last seen)."""
        return cast(ToolCall, self._send(_core.get_tool_call(tool_call_id, wait, since)))

    def wait(
        self, tool_call_id: str, timeout: float = 60, *, until: frozenset[str] = TERMINAL
    ) -> ToolCall:
        """Follow a call with long polls until its status is in `until` (a terminal one) or
        `timeout` seconds pass, and return it as it is then (look at `status`)."""
        deadline = time.monotonic() + timeout
        call = self.tool_call(tool_call_id)
        while call["status"] not in until:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            call = self.tool_call(tool_call_id, wait=left, since=call["updated_at"])
        return call

    # --- run memory: checkpoints, resume, feedback ------------------------------------------

    def put_checkpoint(
        self,
        run_id: str,
        name: str,
        *,
        state: str,
        step_index: int,
        schema_version: int,
        **fields: Any,
    ) -> dict[str, Any]:
        """Write a new version of checkpoint `name` (`kind`, `input`, `decision_ids`,
        `tool_call_ids`, `budgets`, `data` as keywords). The same body again adds nothing."""
        body = {"state": state, "step_index": step_index, "schema_version": schema_version}
        return self._send(Request("PUT", f"/runs/{run_id}/checkpoints/{name}", {**body, **fields}))

    def checkpoint(
        self, run_id: str, name: str, *, schema_version: int | None = None
    ) -> dict[str, Any]:
        """The latest version, migrated to `schema_version` (default: the latest the server
        has migrations for)."""
        params = {"schema_version": schema_version} if schema_version else None
        return self._send(Request("GET", f"/runs/{run_id}/checkpoints/{name}", params=params))

    def resume(self, run_id: str) -> dict[str, Any]:
        """Everything a fresh agent needs to continue the run: the latest checkpoints, the
        progress contract, receipts, calls whose outcome is unknown (never send those again),
        approvals pending with their URLs, and what the runtime checks again."""
        return self._send(Request("GET", f"/runs/{run_id}/resume"))

    def mint_credential(
        self, run_id: str, ttl_s: int, scopes: list[str] | None = None
    ) -> dict[str, Any]:
        """A bearer token for this run only (`token`, shown once), with `scopes` within this
        key's (the key's own when None), for `ttl_s` seconds at most or until the run ends.
        Hand it to a worker: `Countersign(url, credential["token"])`."""
        return self._send(_core.mint_credential(run_id, ttl_s, scopes))

    def feedback(self, run_id: str, **fields: Any) -> dict[str, Any]:
        """Record a feedback fact (`rating` 1-5 or `label`, `text`, and at most one of
        `decision_id`, `tool_call_id`, `approval_id`). Not repeated after a lost answer: a
        second fact would be recorded."""
        request = Request("POST", f"/runs/{run_id}/feedback", fields, repeatable=False)
        return self._send(request)

    def cancel(self, tool_call_id: str, reason: str = "") -> ToolCall:
        """Cancel a call before it is dispatched; after, CountersignError
        `tool_call.already_dispatched` (its outcome is still recorded)."""
        body = {"reason": reason}
        return cast(
            ToolCall, self._send(Request("POST", f"/tool-calls/{tool_call_id}/cancel", body))
        )

    def retry(self, tool_call_id: str) -> ToolCall:
        return cast(ToolCall, self._send(_core.retry(tool_call_id)))

    def reconcile(self, tool_call_id: str) -> ToolCall:
        return cast(ToolCall, self._send(Request("POST", f"/tool-calls/{tool_call_id}/reconcile")))

    def compensate(self, tool_call_id: str) -> ToolCall:
        path = f"/tool-calls/{tool_call_id}/compensate"
        return cast(ToolCall, self._send(Request("POST", path)))
