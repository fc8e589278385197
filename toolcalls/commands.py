"""Commands people and agents give about one call after the fact: retry it, look it up now,
compensate it; and the unknowns desk's resolutions (DESIGN section 9): look up, mark confirmed
with the system's id, mark not happened, abandon, resume the run. Each is checked against the
call's current state and recorded as events with the person and their evidence."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import outbox
from runs.canonical import digest
from runs.errors import RUN_CLOSED, DomainError, not_found
from runs.models import ApiKey, Run, Tenant, User
from runs.services import actor_for_user
from toolcalls import capabilities, errors, gate, lifecycle
from toolcalls.capabilities import Capability
from toolcalls.checks import business_check, invalid
from toolcalls.models import E, Receipt, ToolCall, V
from toolcalls.propose import check_scope, idempotency_key, tool_call_create
from toolcalls.reconcile import look_up
from toolcalls.record import tool_call_accept
from toolcalls.sweeps import leases_sweep_expired
from toolcalls.writes import (
    RECONCILE_TASK,
    capability_of,
    tool_call_event,
    tool_call_lock,
    tool_call_lock_for_tenant,
    tool_call_transition,
)


def tool_call_retry(
    *, tenant: Tenant, tool_call_id: str, actor: str, api_key: ApiKey | None = None
) -> ToolCall:
    """Send a failed call again with the same key, when the failure proved nothing happened.
    An agent's `api_key` must hold a scope for the call's capability, as if it proposed it."""
    with transaction.atomic():
        call = tool_call_lock_for_tenant(tenant, tool_call_id)
        # A contract no longer registered cannot be sent anyway (capability.unknown).
        if api_key is not None and (capability := capabilities.get(call.capability_id)):
            check_scope(api_key, capability)
        if call.execution_status == E.RESULT_UNKNOWN:
            raise DomainError(
                errors.OUTCOME_UNKNOWN,
                "The operation may have happened: reconcile it (look it up) instead.",
            )
        if call.execution_status != E.FAILED or call.last_error_name not in errors.NOT_EXECUTED:
            raise DomainError(
                errors.NOT_RETRYABLE,
                f"Only a call that failed without executing can be retried; this one is "
                f"{call.execution_status} ({call.last_error_name or 'no error'}).",
            )
        if not call.run.is_open:
            raise DomainError(RUN_CLOSED, f"Run {call.run_id} is {call.run.state}.")
        call.next_attempt_at = None
        gate.tool_call_authorize(
            call=call, actor=actor, producer="api", reason="retry asked; same key"
        )
        return call


def tool_call_cancel_before_dispatch(
    *, tenant: Tenant, tool_call_id: str, actor: str, reason: str = ""
) -> ToolCall:
    """The agent no longer wants a call it proposed: cancel it and its open approval, as long
    as nothing was sent. Cancelling a cancelled call answers the same."""
    with transaction.atomic():
        call = tool_call_lock_for_tenant(tenant, tool_call_id)
        if call.execution_status == E.CANCELLED:
            return call
        if call.execution_status not in ToolCall.NOT_SENT:
            raise _not_cancellable(call)
        reason = reason or "cancelled by the agent"
        lifecycle.tool_call_cancel(call=call, actor=actor, producer="api", reason=reason)
        # The run may have waited for this call's approval only.
        lifecycle.run_resume_if_unblocked(run_id=call.run_id, actor=actor, producer="api")
    return call


def _not_cancellable(call: ToolCall) -> DomainError:
    state = {"execution_status": call.execution_status, "status": call.agent_status}
    never_sent = call.execution_status in (E.REJECTED, E.EXPIRED, E.INVALIDATED) or (
        call.execution_status == E.FAILED and not call.attempts.exists()
    )
    if never_sent:
        return DomainError(
            errors.INVALID_STATE,
            f"{call.pk} is {call.execution_status} already; it will not be sent.",
            details=[state],
        )
    return DomainError(
        errors.ALREADY_DISPATCHED,
        f"{call.pk} is {call.execution_status}: it was dispatched, so it cannot be cancelled. "
        "Its outcome is still recorded; compensate a confirmed call to undo it.",
        details=[state],
    )


def tool_call_reconcile_now(*, tenant: Tenant, tool_call_id: str, actor: str) -> ToolCall:
    with transaction.atomic():
        call = tool_call_lock_for_tenant(tenant, tool_call_id)
        if not call.is_unknown:
            raise DomainError(
                errors.NOT_UNKNOWN,
                f"Only an unknown outcome is looked up; this call is {call.execution_status}.",
            )
        outbox.enqueue(RECONCILE_TASK, call.pk)
        return call


def tool_call_compensate(
    *, tenant: Tenant, tool_call_id: str, actor: str, api_key: ApiKey | None = None
) -> tuple[ToolCall, bool]:
    """Undo a confirmed call with its compensating capability; twice gives the same call.
    An agent's `api_key` must hold a scope for the compensating capability, as if it
    proposed it (a person on the desk has none)."""
    original = ToolCall.objects.filter(tenant=tenant, pk=tool_call_id).first()
    if original is None:
        raise not_found("tool call", tool_call_id)
    existing = ToolCall.objects.filter(compensation_of=original).first()
    if existing:
        if api_key is not None:
            check_scope(api_key, capability_of(existing))
        return existing, False
    capability = capability_of(original)
    if not capability.compensation:
        raise DomainError(
            errors.COMPENSATION_NOT_AVAILABLE, f"{capability.id} has no compensating capability."
        )
    if original.verification_status != V.CONFIRMED_SUCCESS:
        raise DomainError(
            errors.COMPENSATION_NOT_CONFIRMED,
            f"Only a confirmed outcome is compensated; this call is {original.execution_status} "
            f"(verification {original.verification_status}).",
        )
    compensating = capabilities.get(capability.compensation)
    if api_key is not None:
        check_scope(api_key, compensating)
    args = capability.compensation_args(original.external_id, original.args)
    problems = business_check(tenant, compensating, args)
    if problems:
        raise invalid(problems)
    object_ref = compensating.object_ref(args)
    key = idempotency_key(tenant, compensating, object_ref, f"compensate:{original.pk}")
    try:
        with transaction.atomic():
            original = tool_call_lock_for_tenant(tenant, tool_call_id)
            tool_call_transition(
                original,
                "start_compensation",
                actor=actor,
                producer="api",
                reason="compensation asked",
            )
            call = tool_call_create(
                run=lifecycle.run_lock(original.run_id),
                capability=compensating,
                args=args,
                args_digest=digest(args),
                key=key,
                intent=f"compensate:{original.pk}",
                object_ref=object_ref,
                object_revision=None,
                decision=original.decision,
                actor=actor,
                compensation_of=original,
            )
    except IntegrityError:
        return ToolCall.objects.get(compensation_of_id=tool_call_id), False
    return call, True


# --- the unknowns desk ----------------------------------------------------------------------


def _require_admin(user: User) -> None:
    if not user.is_tenant_admin:
        raise DomainError(
            errors.DESK_FORBIDDEN, "Only admins resolve unknown outcomes.", status=403
        )


def _lock_unknown(tenant: Tenant, tool_call_id: str) -> ToolCall:
    call = tool_call_lock(tool_call_id)
    if call is None or call.tenant_id != tenant.pk:
        raise not_found("tool call", tool_call_id)
    if not call.is_unknown:
        raise DomainError(
            errors.DESK_NOT_UNKNOWN,
            f"{call.pk} is {call.execution_status} now: nothing to resolve (refresh the page).",
        )
    return call


def _read(tenant: Tenant, tool_call_id: str) -> tuple[ToolCall, Capability]:
    call = ToolCall.objects.select_related("tenant").filter(tenant=tenant, pk=tool_call_id).first()
    if call is None:
        raise not_found("tool call", tool_call_id)
    return call, capability_of(call)


def _look_up_for_person(call: ToolCall, capability: Capability) -> tuple[bool, dict[str, Any]]:
    found, body, error_name, message = look_up(call, capability)
    if error_name:
        raise DomainError(
            errors.DESK_LOOKUP_FAILED,
            f"The look-up failed ({error_name}: {message}); try again.",
            status=503,
        )
    return found, body


def desk_look_up(*, tenant: Tenant, tool_call_id: str, user: User) -> None:
    """Look the operation up now (an expired lease is first declared unknown)."""
    _require_admin(user)
    call = ToolCall.objects.filter(tenant=tenant, pk=tool_call_id).first()
    if call is None:
        raise not_found("tool call", tool_call_id)
    if call.execution_status == E.DISPATCHING:
        leases_sweep_expired()
    tool_call_reconcile_now(tenant=tenant, tool_call_id=tool_call_id, actor=actor_for_user(user))


def desk_claim(*, tenant: Tenant, tool_call_id: str, user: User) -> ToolCall:
    """Take an item on the desk, so other admins see who works on it (taking it over from
    someone else is allowed and recorded)."""
    _require_admin(user)
    with transaction.atomic():
        call = tool_call_lock_for_tenant(tenant, tool_call_id)
        if not (call.is_unknown or call.execution_status == E.DISPATCHING):
            raise DomainError(
                errors.DESK_NOT_UNKNOWN, f"{call.pk} is {call.execution_status}: nothing to take."
            )
        previous = call.desk_owner.username if call.desk_owner else ""
        call.desk_owner, call.desk_claimed_at = user, timezone.now()
        call.save(update_fields=["desk_owner", "desk_claimed_at", "updated_at"])
        tool_call_event(
            call,
            "tool_call.desk_claimed",
            {"by": user.username, **({"from": previous} if previous else {})},
            actor=actor_for_user(user),
            producer="desk",
        )
    return call


def desk_look_up_system(*, tenant: Tenant, system: str, user: User) -> int:
    """During an outage: look up every unknown outcome at one external system now. Returns
    how many look-ups were asked for."""
    _require_admin(user)
    leases_sweep_expired()  # a dispatch whose worker died is unknown first
    asked = 0
    for call in ToolCall.objects.filter(tenant=tenant, execution_status__in=ToolCall.UNKNOWN):
        capability = capabilities.get(call.capability_id)
        if capability and capability.system == system and capability.lookup_path:
            tool_call_reconcile_now(tenant=tenant, tool_call_id=call.pk, actor=actor_for_user(user))
            asked += 1
    return asked


def desk_mark_confirmed(
    *, tenant: Tenant, tool_call_id: str, user: User, external_id: str, evidence: str
) -> ToolCall:
    """A person says the operation happened, with its external id. Where the system has a
    look-up, it must agree."""
    _require_admin(user)
    external_id = external_id.strip()
    if not external_id:
        raise DomainError(
            errors.DESK_EXTERNAL_ID_REQUIRED, "Give the operation's id at the system.", status=422
        )
    call, capability = _read(tenant, tool_call_id)
    body: dict[str, Any] = {capability.external_id_field: external_id}
    if capability.lookup_path:
        found, looked_up = _look_up_for_person(call, capability)
        if not found:
            raise DomainError(
                errors.DESK_NOT_FOUND_AT_SYSTEM,
                f"{capability.system} has no operation with our request id "
                f"{call.external_request_id}: it cannot be confirmed as {external_id}.",
            )
        actual = str(looked_up.get(capability.external_id_field, ""))
        if actual != external_id:
            raise DomainError(
                errors.DESK_ID_MISMATCH,
                f"{capability.system} knows this operation as {actual}, not {external_id}.",
            )
        body = looked_up
    elif not evidence.strip():
        raise DomainError(
            errors.DESK_EVIDENCE_REQUIRED,
            "This system has no look-up: say how you checked.",
            status=422,
        )
    with transaction.atomic():
        call = _lock_unknown(tenant, tool_call_id)
        actor = actor_for_user(user)
        tool_call_accept(
            call=call,
            capability=capability,
            body=body,
            source=Receipt.Source.PERSON,
            status=Receipt.Status.CREATED,
            actor=actor,
            evidence=evidence or "matched the system's look-up",
        )
        lifecycle.run_resume_if_unblocked(run_id=call.run_id, actor=actor, producer="desk")
    return call


def desk_mark_not_happened(
    *, tenant: Tenant, tool_call_id: str, user: User, evidence: str
) -> ToolCall:
    """A person says the operation did not happen. Where the system has a look-up, it must
    show nothing past the consistency window. Afterwards a retry with the same key is allowed."""
    _require_admin(user)
    call, capability = _read(tenant, tool_call_id)
    if capability.lookup_path:
        found, looked_up = _look_up_for_person(call, capability)
        if found:
            actual = looked_up.get(capability.external_id_field, "")
            raise DomainError(
                errors.DESK_IT_HAPPENED,
                f"{capability.system} has it ({actual}): confirm it instead.",
            )
        last = call.attempts.order_by("-number").first()
        sent: datetime | None = (last.ended_at or last.started_at) if last else None
        if sent and (timezone.now() - sent).total_seconds() < capability.consistency_window:
            raise DomainError(
                errors.DESK_TOO_EARLY,
                f"The look-up may lag {capability.consistency_window:g} s; try again shortly.",
            )
    elif not evidence.strip():
        raise DomainError(
            errors.DESK_EVIDENCE_REQUIRED,
            "This system has no look-up: say how you checked.",
            status=422,
        )
    with transaction.atomic():
        call = _lock_unknown(tenant, tool_call_id)
        actor = actor_for_user(user)
        call.last_error_name = errors.DID_NOT_HAPPEN
        call.last_error_message = evidence or "the look-up found nothing"
        tool_call_transition(
            call,
            "fail",
            actor=actor,
            producer="desk",
            error_name=errors.DID_NOT_HAPPEN,
            evidence=evidence or "the look-up found nothing past the consistency window",
        )
        lifecycle.run_resume_if_unblocked(run_id=call.run_id, actor=actor, producer="desk")
    return call


def desk_abandon(*, tenant: Tenant, tool_call_id: str, user: User, reason: str) -> ToolCall:
    _require_admin(user)
    if not reason.strip():
        raise DomainError(errors.DESK_REASON_REQUIRED, "Say why it is abandoned.", status=422)
    with transaction.atomic():
        call = _lock_unknown(tenant, tool_call_id)
        actor = actor_for_user(user)
        call.last_error_name, call.last_error_message = errors.ABANDONED, reason
        tool_call_transition(
            call, "fail", actor=actor, producer="desk", error_name=errors.ABANDONED, evidence=reason
        )
        lifecycle.run_resume_if_unblocked(run_id=call.run_id, actor=actor, producer="desk")
    return call


def desk_resume_run(*, tenant: Tenant, run_id: str, user: User, reason: str) -> Run:
    """A run handed to a person with nothing unknown in it (an approval expired): carry on."""
    _require_admin(user)
    return lifecycle.run_resume_by_person(
        tenant=tenant, run_id=run_id, actor=actor_for_user(user), reason=reason
    )
