"""The progress contract of a run (DESIGN section 11), derived from stored state only.

A fresh agent, or a person, reads it to resume without redoing or breaking what works:
what is verified, what is still open, and the next step that is safe to take.
"""

from __future__ import annotations

from typing import Any

from approvals.models import Approval
from runs.models import Run
from toolcalls import capabilities
from toolcalls.errors import NOT_EXECUTED
from toolcalls.models import Attempt, E, ToolCall, V


def _summary(call: ToolCall) -> str:
    capability = capabilities.get(call.capability_id)
    return capability.summary(call.args) if capability else call.capability_id


def _open_kind(call: ToolCall) -> str | None:
    if call.execution_status == E.NEEDS_HUMAN:
        return "needs_human"
    if call.execution_status == E.RESULT_UNKNOWN:
        return "result_unknown"
    if call.execution_status == E.AWAITING_APPROVAL:
        return "awaiting_approval"
    if call.execution_status == E.AUTHORIZED and any(
        d.verification_status != V.CONFIRMED_SUCCESS for d in call.depends_on.all()
    ):
        return "waiting_on_dependencies"
    if call.execution_status in ToolCall.ON_ITS_WAY:
        return "in_flight"
    if call.verification_status == V.PENDING:
        return "verification_pending"
    return None


def _budget(used: int, limit: int) -> dict[str, int]:
    return {"used": used, "max": limit, "left": max(limit - used, 0)}


def progress(run: Run, calls: list[ToolCall] | None = None) -> dict[str, Any]:
    """`calls`: the run's calls when the caller has them already (with depends_on
    prefetched), so a page does not read them twice."""
    if calls is None:
        calls = list(ToolCall.objects.filter(run=run).prefetch_related("depends_on").order_by("id"))
    # Only each pending approval's id is named: read as values, no Approval objects.
    approvals = dict(
        Approval.objects.filter(run=run, state=Approval.State.PENDING).values_list(
            "tool_call_id", "id"
        )
    )
    verified, open_items, failed = [], [], []
    for call in calls:
        item = {
            "tool_call_id": call.pk,
            "capability": call.capability_id,
            "summary": _summary(call),
            "execution_status": call.execution_status,
            "verification_status": call.verification_status,
        }
        kind = _open_kind(call)
        if kind:
            open_items.append({**item, "kind": kind, "approval_id": approvals.get(call.pk)})
        elif call.verification_status == V.CONFIRMED_SUCCESS:
            verified.append({**item, "external_id": call.external_id})
        elif call.did_not_succeed:
            failed.append({**item, "error": call.last_error_name or call.verification_status})
    return {
        "run_id": run.pk,
        "state": run.state,
        "budgets": {
            "tool_calls": _budget(len(calls), run.max_tool_calls),
            "attempts": _budget(Attempt.objects.filter(run=run).count(), run.max_attempts),
            "deadline": run.deadline,
        },
        "verified": verified,
        "open": open_items,
        "failed": failed,
        "next_safe_step": next_safe_step(run, verified, open_items, failed),
    }


def next_safe_step(run: Run, verified: list, open_items: list, failed: list) -> str:
    by_kind: dict[str, list[dict]] = {}
    for item in open_items:
        by_kind.setdefault(item["kind"], []).append(item)

    def ids(kind: str) -> str:
        return ", ".join(item["tool_call_id"] for item in by_kind[kind])

    if not run.is_open and run.state != Run.State.NEEDS_HUMAN:
        if open_items:
            return (
                f"Nothing to do: the run is {run.state}; {len(open_items)} call(s) still "
                "settle on their own. Read this again later; do not repeat them."
            )
        return f"Nothing: the run is {run.state}."
    if "needs_human" in by_kind:
        return (
            f"A person must resolve {ids('needs_human')} in the unknowns desk: the outcome "
            "is unknown after every look-up. Do not send it again."
        )
    if "result_unknown" in by_kind:
        return (
            f"Wait: the outcome of {ids('result_unknown')} is being looked up at the "
            "external system. Do not send it again; proposing the same intent returns "
            "the same call."
        )
    if "awaiting_approval" in by_kind:
        approvals = ", ".join(i["approval_id"] or "?" for i in by_kind["awaiting_approval"])
        return (
            f"Wait for approval {approvals} ({ids('awaiting_approval')}); do not propose it again."
        )
    for kind in ("in_flight", "verification_pending", "waiting_on_dependencies"):
        if kind in by_kind:
            first = by_kind[kind][0]["tool_call_id"]
            return (
                f"Wait for {ids(kind)} to settle (GET /api/v1/tool-calls/{first}?wait=30); "
                "nothing needs repeating."
            )
    retryable = [f for f in failed if f["error"] in NOT_EXECUTED]
    if retryable:
        first = retryable[0]
        return (
            f"{first['tool_call_id']} failed without executing ({first['error']}): retry it "
            f"(POST /api/v1/tool-calls/{first['tool_call_id']}/retry) or propose another way."
        )
    if failed:
        first = failed[0]
        return (
            f"{first['tool_call_id']} did not succeed ({first['error']}): decide how to "
            "proceed, then finish the run (POST /api/v1/runs/{run_id}/complete).".replace(
                "{run_id}", run.pk
            )
        )
    if verified:
        return (
            "Every call is verified: take the next step of the task, or finish the run "
            f"(POST /api/v1/runs/{run.pk}/complete)."
        )
    return "Propose the first tool call."
