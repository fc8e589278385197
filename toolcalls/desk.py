"""The unknowns desk: what automation could not settle, and the commands people use on it.

Every command is recorded as events with the person and their evidence. None can produce a
second external effect: "confirmed" and "did not happen" are checked against the system's
look-up where it has one, and a retry after "did not happen" reuses the same key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from approvals.models import Approval
from runs.errors import DomainError, not_found
from runs.models import Event, Run, Tenant, User
from runs.services import actor_for_user, run_transition
from toolcalls import capabilities, services
from toolcalls.models import E, Receipt, ToolCall, V

UNKNOWN_STATES = (E.RESULT_UNKNOWN, E.NEEDS_HUMAN)


# --- reads ----------------------------------------------------------------------------------


def _entered(event_type: str) -> Subquery:
    return Subquery(
        Event.objects.filter(tool_call_id=OuterRef("pk"), event_type=event_type)
        .order_by("-seq")
        .values("occurred_at")[:1]
    )


def desk_items(*, tenant: Tenant) -> list[dict[str, Any]]:
    """Unknown outcomes, dispatches whose worker's lease expired, and runs that need a person,
    longest dwell first."""
    now = timezone.now()
    items: list[dict[str, Any]] = []
    calls = (
        ToolCall.objects.filter(tenant=tenant)
        .filter(
            Q(execution_status__in=UNKNOWN_STATES)
            | Q(execution_status=E.DISPATCHING, lease_expires_at__lt=now)
        )
        .select_related("run")
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


def handoff(call: ToolCall) -> dict[str, Any]:
    """Everything a person needs to decide about one unknown action."""
    run = call.run
    capability = capabilities.get(call.capability_id)
    calls = list(ToolCall.objects.filter(run=run).order_by("id"))
    return {
        "run": run,
        "call": call,
        "capability": capability,
        "summary": capability.summary(call.args) if capability else call.capability_id,
        "decision": call.decision,
        "confirmed": [c for c in calls if c.verification_status == V.CONFIRMED_SUCCESS],
        "unknown": [
            c
            for c in calls
            if c.execution_status in UNKNOWN_STATES or c.execution_status == E.DISPATCHING
        ],
        "receipts": list(Receipt.objects.filter(tool_call__run=run).select_related("tool_call")),
        "attempts": list(call.attempts.order_by("number")),
        "approvals": list(Approval.objects.filter(run=run).prefetch_related("decisions__user")),
        "events": list(Event.objects.filter(tool_call_id=call.pk).order_by("seq")),
        "suggestion": suggestion(call, capability),
        "unresolved": call.execution_status in (*UNKNOWN_STATES, E.DISPATCHING),
    }


def suggestion(call: ToolCall, capability: capabilities.Capability | None) -> str:
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


# --- commands -------------------------------------------------------------------------------


def _lock_unknown(tenant: Tenant, tool_call_id: str) -> ToolCall:
    call = services.lock_call(tool_call_id)
    if call is None or call.tenant_id != tenant.pk:
        raise not_found("tool call", tool_call_id)
    if call.execution_status not in UNKNOWN_STATES:
        raise DomainError(
            "desk.not_unknown",
            f"{call.pk} is {call.execution_status} now: nothing to resolve (refresh the page).",
        )
    return call


def _require_admin(user: User) -> None:
    if not user.is_tenant_admin:
        raise DomainError("desk.forbidden", "Only admins resolve unknown outcomes.", status=403)


def desk_look_up(*, tenant: Tenant, tool_call_id: str, user: User) -> None:
    """Look the operation up now (an expired lease is first declared unknown)."""
    _require_admin(user)
    call = ToolCall.objects.filter(tenant=tenant, pk=tool_call_id).first()
    if call is None:
        raise not_found("tool call", tool_call_id)
    if call.execution_status == E.DISPATCHING:
        services.sweep_expired_leases()
    services.tool_call_reconcile_now(
        tenant=tenant, tool_call_id=tool_call_id, actor=actor_for_user(user)
    )


def desk_mark_confirmed(
    *, tenant: Tenant, tool_call_id: str, user: User, external_id: str, evidence: str
) -> ToolCall:
    """A person says the operation happened, with its external id. Where the system has a
    look-up, it must agree."""
    _require_admin(user)
    external_id = external_id.strip()
    if not external_id:
        raise DomainError(
            "desk.external_id_required", "Give the operation's id at the system.", status=422
        )
    call = ToolCall.objects.select_related("tenant").filter(tenant=tenant, pk=tool_call_id).first()
    if call is None:
        raise not_found("tool call", tool_call_id)
    capability = capabilities.get(call.capability_id)
    body: dict[str, Any] = {capability.external_id_field: external_id}
    if capability.lookup_path:
        found, looked_up, error = services.look_up(call, capability)
        if error:
            raise DomainError(
                "desk.lookup_failed", f"The look-up failed ({error}); try again.", status=503
            )
        if not found:
            raise DomainError(
                "desk.not_found_at_system",
                f"{capability.system} has no operation with our request id "
                f"{call.external_request_id}: it cannot be confirmed as {external_id}.",
            )
        actual = str(looked_up.get(capability.external_id_field, ""))
        if actual != external_id:
            raise DomainError(
                "desk.id_mismatch",
                f"{capability.system} knows this operation as {actual}, not {external_id}.",
            )
        body = looked_up
    elif not evidence.strip():
        raise DomainError(
            "desk.evidence_required", "This system has no look-up: say how you checked.", status=422
        )
    with transaction.atomic():
        call = _lock_unknown(tenant, tool_call_id)
        actor = actor_for_user(user)
        services.accept(
            call,
            capability,
            body,
            source=Receipt.Source.PERSON,
            status=Receipt.Status.CREATED,
            actor=actor,
            evidence=evidence or "matched the system's look-up",
        )
        services.resume_run_if_resolved(call.run_id, actor, producer="desk")
    return call


def desk_mark_not_happened(
    *, tenant: Tenant, tool_call_id: str, user: User, evidence: str
) -> ToolCall:
    """A person says the operation did not happen. Where the system has a look-up, it must
    show nothing past the consistency window. Afterwards a retry with the same key is allowed."""
    _require_admin(user)
    call = ToolCall.objects.select_related("tenant").filter(tenant=tenant, pk=tool_call_id).first()
    if call is None:
        raise not_found("tool call", tool_call_id)
    capability = capabilities.get(call.capability_id)
    if capability.lookup_path:
        found, looked_up, error = services.look_up(call, capability)
        if error:
            raise DomainError(
                "desk.lookup_failed", f"The look-up failed ({error}); try again.", status=503
            )
        if found:
            actual = looked_up.get(capability.external_id_field, "")
            raise DomainError(
                "desk.it_happened",
                f"{capability.system} has it ({actual}): confirm it instead.",
            )
        last = call.attempts.order_by("-number").first()
        sent: datetime | None = (last.ended_at or last.started_at) if last else None
        if sent and (timezone.now() - sent).total_seconds() < capability.consistency_window:
            raise DomainError(
                "desk.too_early",
                f"The look-up may lag {capability.consistency_window:g} s; try again shortly.",
            )
    elif not evidence.strip():
        raise DomainError(
            "desk.evidence_required", "This system has no look-up: say how you checked.", status=422
        )
    with transaction.atomic():
        call = _lock_unknown(tenant, tool_call_id)
        actor = actor_for_user(user)
        call.last_error_name = "tool.did_not_happen"
        call.last_error_message = evidence or "the look-up found nothing"
        services.call_transition(
            call,
            "fail",
            actor=actor,
            producer="desk",
            error_name="tool.did_not_happen",
            evidence=evidence or "the look-up found nothing past the consistency window",
        )
        call.save()
        services.resume_run_if_resolved(call.run_id, actor, producer="desk")
    return call


def desk_abandon(*, tenant: Tenant, tool_call_id: str, user: User, reason: str) -> ToolCall:
    _require_admin(user)
    if not reason.strip():
        raise DomainError("desk.reason_required", "Say why it is abandoned.", status=422)
    with transaction.atomic():
        call = _lock_unknown(tenant, tool_call_id)
        actor = actor_for_user(user)
        call.last_error_name, call.last_error_message = "tool.abandoned", reason
        services.call_transition(
            call, "fail", actor=actor, producer="desk", error_name="tool.abandoned", evidence=reason
        )
        call.save()
        services.resume_run_if_resolved(call.run_id, actor, producer="desk")
    return call


def desk_resume_run(*, tenant: Tenant, run_id: str, user: User, reason: str) -> Run:
    """A run handed to a person with nothing unknown in it (an approval expired): carry on."""
    _require_admin(user)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(tenant=tenant, pk=run_id).first()
        if run is None:
            raise not_found("run", run_id)
        if ToolCall.objects.filter(run=run, execution_status__in=UNKNOWN_STATES).exists():
            raise DomainError("desk.unknowns_left", "Resolve its unknown calls first.")
        return run_transition(
            run,
            "resume",
            actor=actor_for_user(user),
            producer="desk",
            reason=reason or "resumed from the desk",
        )
