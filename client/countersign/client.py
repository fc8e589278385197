"""A small Python client for the agent API: the common path is one call each.

    from countersign import Countersign
    cs = Countersign("http://127.0.0.1:8000", api_key)
    run = cs.start_run("Refund order-001", idempotency_key="refund-order-001")
    cs.record_decision(run["run_id"], "refund_eligibility", {"eligible": True})

It depends on httpx only.
"""

from __future__ import annotations

import time
from typing import Any

import httpx


class CountersignError(Exception):
    """The API refused a request; `name` is the stable dotted error name."""

    def __init__(self, status: int, name: str, message: str, details: list[Any]) -> None:
        super().__init__(f"{status} {name}: {message}")
        self.status = status
        self.name = name
        self.message = message
        self.details = details


class Countersign:
    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0) -> None:
        self.http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self.http.close()

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        response = self.http.request(method, path, json=body, headers=headers, params=params)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError):
                error = {"name": "http.error", "message": response.text[:200], "details": []}
            raise CountersignError(
                response.status_code, error["name"], error["message"], error.get("details", [])
            )
        return response.json()

    def start_run(
        self, title: str, *, idempotency_key: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._call("POST", "/runs", {"title": title, **fields}, headers=headers)

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/runs/{run_id}")

    def record_decision(
        self, run_id: str, kind: str, content: dict[str, Any], supersedes: str | None = None
    ) -> dict[str, Any]:
        body = {"kind": kind, "content": content, "supersedes": supersedes}
        return self._call("POST", f"/runs/{run_id}/decisions", body)

    def stop_run(self, run_id: str, reason: str = "") -> dict[str, Any]:
        return self._call("POST", f"/runs/{run_id}/stop", {"reason": reason})

    def finish_run(
        self, run_id: str, *, failed_permanently: bool = False, reason: str = ""
    ) -> dict[str, Any]:
        body = {"failed_permanently": failed_permanently, "reason": reason}
        return self._call("POST", f"/runs/{run_id}/complete", body)

    def progress(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/runs/{run_id}/progress")

    def compensate(self, tool_call_id: str) -> dict[str, Any]:
        return self._call("POST", f"/tool-calls/{tool_call_id}/compensate")

    def capabilities(self) -> list[dict[str, Any]]:
        return self.http.get("/capabilities").json()

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
    ) -> dict[str, Any]:
        """Propose a tool call. Safe to repeat: the same intent and args give the same call."""
        body: dict[str, Any] = {"capability": capability, "args": args, "intent": intent}
        if depends_on:
            body["depends_on"] = depends_on
        if decision_id:
            body["decision_id"] = decision_id
        if object_ref or object_revision is not None:
            body["object"] = {"ref": object_ref, "revision": object_revision}
        return self._call("POST", f"/runs/{run_id}/tool-calls", body)

    def tool_call(self, tool_call_id: str, wait: float = 0, since: str = "") -> dict[str, Any]:
        """Read a call; with `wait`, answer as soon as it changes after `since` (the
        `updated_at` last seen), at most 30 s later."""
        params: dict[str, Any] = {"wait": wait}
        if since:
            params["since"] = since
        return self._call("GET", f"/tool-calls/{tool_call_id}", params=params)

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
        return self._call("PUT", f"/runs/{run_id}/checkpoints/{name}", {**body, **fields})

    def checkpoint(
        self, run_id: str, name: str, *, schema_version: int | None = None
    ) -> dict[str, Any]:
        """The latest version, migrated to `schema_version` (default: the latest the server
        has migrations for)."""
        params = {"schema_version": schema_version} if schema_version else None
        return self._call("GET", f"/runs/{run_id}/checkpoints/{name}", params=params)

    def resume(self, run_id: str) -> dict[str, Any]:
        """Everything a fresh agent needs to continue the run: the latest checkpoints, the
        progress contract, receipts, calls whose outcome is unknown (never send those again),
        approvals pending with their URLs, and what the runtime checks again."""
        return self._call("GET", f"/runs/{run_id}/resume")

    def feedback(self, run_id: str, **fields: Any) -> dict[str, Any]:
        """Record a feedback fact (`rating` 1-5 or `label`, `text`, and at most one of
        `decision_id`, `tool_call_id`, `approval_id`)."""
        return self._call("POST", f"/runs/{run_id}/feedback", fields)

    def wait_settled(self, tool_call_id: str, timeout: float = 120) -> dict[str, Any]:
        """Follow a call until its execution and verification can no longer move by
        themselves (or the timeout passes), and return it."""
        deadline = time.monotonic() + timeout
        call = self.tool_call(tool_call_id)
        while time.monotonic() < deadline and not is_settled(call):
            wait = min(20, max(deadline - time.monotonic(), 0))
            call = self.tool_call(tool_call_id, wait=wait, since=call["updated_at"])
        return call


SETTLED_EXECUTION = {
    "completed",
    "failed",
    "rejected",
    "expired",
    "invalidated",
    "cancelled",
    "compensated",
    "needs_human",
}


def is_settled(call: dict[str, Any]) -> bool:
    return (
        call["execution_status"] in SETTLED_EXECUTION and call["verification_status"] != "pending"
    )
