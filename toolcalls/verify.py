"""Verification: observe domain reality for an accepted call (DESIGN section 4). It is a
separate machine from execution: it can lag completion, disagree with it (inconclusive), or be
all that is left when the command's own answer was lost."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from runs import outbox, transitions
from toolcalls import sql_batch
from toolcalls.capabilities import Capability, TrustedData, UpstreamUnavailable
from toolcalls.models import E, ToolCall, V
from toolcalls.writes import (
    DISPATCH_TASK,
    VERIFY_TASK,
    capability_of,
    tool_call_lock,
    tool_call_transition,
)

MAX_VERIFICATIONS = 6
SYSTEM = "system:verifier"


def mark_done(outbox_id: str | None) -> None:
    with transaction.atomic():
        outbox.mark_done(outbox_id)


def tool_call_verify(
    *, tool_call_id: str, outbox_id: str | None = None, call: ToolCall | None = None
) -> None:
    """Look at the system and judge the outcome. Like reconcile, it marks its outbox message
    done only with its result. `call` is the dispatcher's copy of it, just committed, which
    saves reading it again; it is locked again to write."""
    if call is None:
        call = ToolCall.objects.select_related("tenant").filter(pk=tool_call_id).first()
    if call is None or call.verification_status != V.PENDING:
        mark_done(outbox_id)
        return
    judgment = observe(call)
    with transaction.atomic():
        judge(tool_call_id, outbox_id, judgment)


def observe(call: ToolCall) -> str:
    """Look at the system (no database): the capability's judgment, or "unavailable"."""
    return observe_answer(capability_of(call), call.tenant.slug, call.external_id, call.args)


def observe_answer(
    capability: Capability,
    tenant_slug: str,
    external_id: str,
    args: dict[str, Any],
    timeout: float = 5.0,
) -> str:
    """`observe` from what a dispatch knows before it records the answer (a batch observes
    first and writes the record and the judgment in one transaction). `timeout` bounds each
    read's connect and every wait for bytes."""
    try:
        return capability.verify(TrustedData(tenant_slug, timeout=timeout), external_id, args)
    except UpstreamUnavailable:
        return "unavailable"


def judge(
    tool_call_id: str,
    outbox_id: str | None,
    judgment: str,
    locked: ToolCall | None = None,
    confirmed: list[str] | None = None,
) -> None:
    """Write what the observation proves, in the caller's transaction (a batch of
    dispatches writes all its verifications in one, its calls `locked` already, their
    messages marked done together). With `confirmed`, a call that is confirmed is appended
    there and the caller wakes the calls that depend on it (`wake_dependents`, one query for
    the batch) instead of this reading them."""
    outbox.mark_done(outbox_id)
    call = locked or tool_call_lock(tool_call_id)
    if call.verification_status != V.PENDING:
        return
    call.verifications += 1
    if judgment in ("confirmed_success", "confirmed_failure"):
        action = "confirm_success" if judgment == "confirmed_success" else "confirm_failure"
        tool_call_transition(call, action, actor=SYSTEM, producer="verifier")
        if action == "confirm_success" and call.compensation_of_id:
            _finish_compensation(call)
        if confirmed is None:
            _wake_dependents(call)
        else:
            confirmed.append(call.id)
        return
    if call.verifications >= MAX_VERIFICATIONS:
        tool_call_transition(
            call,
            "find_inconclusive",
            actor=SYSTEM,
            producer="verifier",
            reason=f"{judgment} after {call.verifications} observations",
        )
        return
    transitions.save_fields(call, ["verifications", "updated_at"])
    outbox.enqueue(VERIFY_TASK, call.pk, countdown=0.5 * 2**call.verifications)


def _wake_dependents(call: ToolCall) -> None:
    wake_dependents([call.pk])


def wake_dependents(tool_call_ids: list[str]) -> None:
    """Dispatch the authorized calls that wait for these (confirmed or failed) calls."""
    if not tool_call_ids:
        return
    for dependent_id in sql_batch.authorized_waiting_for(tool_call_ids):
        outbox.enqueue(DISPATCH_TASK, dependent_id)


def _finish_compensation(compensation: ToolCall) -> None:
    original = tool_call_lock(compensation.compensation_of_id)
    if original.execution_status == E.COMPENSATING:
        tool_call_transition(
            original,
            "finish_compensation",
            actor=SYSTEM,
            producer="verifier",
            reason=f"compensated by {compensation.pk}",
        )
