"""Reads of the unknowns desk: what automation could not settle, and each item's handoff
packet. Its commands are in toolcalls/commands.py."""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from approvals.models import Approval
from runs.models import Event, Run, Tenant
from toolcalls import capabilities
from toolcalls.models import E, Receipt, ToolCall, V

# --- reads ----------------------------------------------------------------------------------


def _entered(event_type: str) -> Subquery:
    return Subquery(
        Event.objects.filter(tool_call_id=OuterRef("pk"), event_type=event_type)
        .order_by("-seq")
        .values("occurred_at")[:1]
    )


def desk_has_items(*, tenant: Tenant) -> bool:
    """Is anything waiting on the desk? Two EXISTS queries, for the start page."""
    stuck = Q(execution_status__in=ToolCall.UNKNOWN) | Q(
        execution_status=E.DISPATCHING, lease_expires_at__lt=timezone.now()
    )
    return (
        ToolCall.objects.filter(stuck, tenant=tenant).exists()
        or Run.objects.filter(tenant=tenant, state=Run.State.NEEDS_HUMAN).exists()
    )


def desk_items(*, tenant: Tenant) -> list[dict[str, Any]]:
    """Unknown outcomes, dispatches whose worker's lease expired, and runs that need a person,
    longest dwell first."""
    now = timezone.now()
    items: list[dict[str, Any]] = []
    calls = (
        ToolCall.objects.filter(tenant=tenant)
        .filter(
            Q(execution_status__in=ToolCall.UNKNOWN)
            | Q(execution_status=E.DISPATCHING, lease_expires_at__lt=now)
        )
        .select_related("run", "desk_owner")
        # The list shows none of these, and during an outage it reads thousands of rows.
        .defer("args", "result", "last_error_message", "run__metadata")
        .annotate(
            unknown_since=_entered("tool_call.result_unknown"),
            human_since=_entered("tool_call.needs_human"),
            dispatched_since=_entered("tool_call.dispatching"),
        )
    )
    for call in calls:
        since = {
            E.RESULT_UNKNOWN: call.unknown_since,
            E.NEEDS_HUMAN: call.human_since,
        }.get(call.execution_status, call.dispatched_since)
        kind = "lease_expired" if call.execution_status == E.DISPATCHING else call.execution_status
        items.append({"kind": kind, "call": call, "run": call.run, "since": since or now})
    flagged_runs = {item["run"].pk for item in items}
    runs = Run.objects.filter(tenant=tenant, state=Run.State.NEEDS_HUMAN).annotate(
        human_since=Subquery(
            Event.objects.filter(run=OuterRef("pk"), event_type="run.needs_human")
            .order_by("-seq")
            .values("occurred_at")[:1]
        )
    )
    for run in runs:
        if run.pk not in flagged_runs:
            items.append(
                {
                    "kind": "run_needs_human",
                    "call": None,
                    "run": run,
                    "since": run.human_since or now,
                }
            )
    for item in items:
        item["dwell_seconds"] = int((now - item["since"]).total_seconds())
    return sorted(items, key=lambda item: item["since"])


def systems_of(items: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """The external systems with unknown outcomes on the desk, and how many each (during an
    outage an admin looks them all up at once)."""
    counts: dict[str, int] = {}
    for item in items:
        call = item["call"]
        capability = capabilities.get(call.capability_id) if call else None
        if capability and capability.lookup_path:
            counts[capability.system] = counts.get(capability.system, 0) + 1
    return sorted(counts.items())


def handoff(call: ToolCall) -> dict[str, Any]:
    """Everything a person needs to decide about one unknown action."""
    run = call.run
    capability = capabilities.get(call.capability_id)
    calls = list(ToolCall.objects.filter(run=run).order_by("id"))
    events = list(Event.objects.filter(tool_call_id=call.pk).order_by("seq"))
    return {
        "run": run,
        "call": call,
        "capability": capability,
        "summary": capability.summary(call.args) if capability else call.capability_id,
        "decision": call.decision,
        "confirmed": [c for c in calls if c.verification_status == V.CONFIRMED_SUCCESS],
        "unknown": [c for c in calls if c.is_unknown or c.execution_status == E.DISPATCHING],
        "receipts": list(Receipt.objects.filter(tool_call__run=run).select_related("tool_call")),
        "attempts": list(call.attempts.order_by("number")),
        "approvals": list(Approval.objects.filter(run=run).prefetch_related("decisions__user")),
        "events": events,
        "lookups": [lookup_result(event) for event in events if event.event_type == LOOKED_UP],
        "suggestion": suggestion(call, capability),
        "unresolved": call.is_unknown or call.execution_status == E.DISPATCHING,
    }


LOOKED_UP = "tool_call.looked_up"


def lookup_result(event: Event) -> dict[str, Any]:
    """One look-up at the external system, in words: found, not found, or failed (and why)."""
    payload = event.payload
    if payload.get("found"):
        outcome = f"found ({payload.get('external_id', '')})"
    elif payload.get("error_name"):
        outcome = f"failed: {payload['error_name']} {payload.get('message', '')}".strip()
    elif payload.get("within_consistency_window"):
        outcome = "not found yet (inside the consistency window: proves nothing)"
    else:
        outcome = "not found"
    return {"at": event.occurred_at, "number": payload.get("lookup"), "outcome": outcome}


def suggestion(call: ToolCall, capability: capabilities.Capability | None) -> str:
    """The next step for this call as it is now (recomputed after every resolution)."""
    if not (call.is_unknown or call.execution_status == E.DISPATCHING):
        return settled_suggestion(call, capability)
    if call.execution_status == E.DISPATCHING:
        return (
            "Its worker stopped answering (the lease expired): look it up now; the sweeper "
            "will do the same within seconds."
        )
    if capability and capability.lookup_path:
        return (
            f"Look it up now at {capability.system}. If it is found, it is confirmed with the "
            f"receipt. If it stays missing past the {capability.consistency_window:g} s "
            "consistency window, mark it as not happened and retry with the same key."
        )
    if capability and capability.remote_dedupe_window:
        return (
            f"{capability.system} has no look-up but deduplicates our key: retrying with the "
            "same key cannot double it."
        )
    return (
        f"{call.capability_id} has no look-up and the system does not deduplicate: check "
        "at the system by hand, then mark it confirmed (with its id) or not happened."
    )


def settled_suggestion(call: ToolCall, capability: capabilities.Capability | None) -> str:
    if call.last_error_name == "tool.did_not_happen" and call.execution_status == E.FAILED:
        return (
            "It did not happen: retry it with the same key if it is still wanted, or leave it "
            "failed and let the run go on."
        )
    if call.execution_status == E.FAILED:
        return f"Nothing more to do here: it failed ({call.last_error_name or 'no error'})."
    if call.is_verified:
        compensable = capability and capability.compensation and not call.has_compensation
        more = (
            f" If it must be undone, compensate it ({capability.compensation})."
            if compensable
            else ""
        )
        return f"Nothing to do: it happened and is confirmed ({call.external_id}).{more}"
    return (
        f"Nothing to do now: it is {call.get_execution_status_display().lower()}, verification "
        f"{call.get_verification_status_display().lower()}; it settles by itself."
    )
