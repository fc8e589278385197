"""Reconcile: look an unknown outcome up at the external system before anything is sent again
(DESIGN section 6). Found → accepted with the look-up's receipt. Not found past the capability's
consistency window → authorized again with the same key. Still unknown after the policy's
look-ups → a person owns it (needs_human)."""

from __future__ import annotations

from typing import Any

import httpx
from django.db import transaction
from django.utils import timezone

from runs import outbox
from toolcalls import channels, connectors, errors, gate, lifecycle
from toolcalls.capabilities import Capability
from toolcalls.models import E, Receipt, ToolCall
from toolcalls.record import tool_call_accept
from toolcalls.verify import mark_done
from toolcalls.writes import (
    RECONCILE_TASK,
    capability_of,
    timeout_of,
    tool_call_event,
    tool_call_lock,
    tool_call_transition,
)

SYSTEM = "system:reconciler"


def tool_call_reconcile(*, tool_call_id: str, outbox_id: str | None = None) -> None:
    """Its outbox message is marked done with the result, in the last transaction: a worker
    that dies in the middle leaves it undone, and the sweeper sends it again."""
    call = ToolCall.objects.select_related("tenant").filter(pk=tool_call_id).first()
    if call is None or not call.is_unknown:
        mark_done(outbox_id)
        return
    capability = capability_of(call)
    token = call.fencing_token
    found, body, error_name, message = look_up(call, capability)
    with transaction.atomic():
        outbox.mark_done(outbox_id)
        call = tool_call_lock(tool_call_id)
        if call.fencing_token != token or not call.is_unknown:
            return
        _apply_lookup(call, capability, found, body, error_name, message)


def look_up(call: ToolCall, capability: Capability) -> tuple[bool, dict[str, Any], str, str]:
    """(found, body, error name, message); an error name means the look-up proved nothing."""
    if capability.lookup_path is None:
        return False, {}, errors.NO_LOOKUP, "the capability has no look-up"
    endpoint = connectors.endpoint_for(call.tenant.slug, capability.system)
    try:
        response = connectors.request(
            endpoint,
            "GET",
            capability.lookup_path,
            params={"request_id": call.external_request_id},
            timeout=timeout_of(capability),
        )
    except httpx.HTTPError as exc:
        return False, {}, errors.LOOKUP_UNREACHABLE, f"{type(exc).__name__}: {exc}"
    if response.status_code == 200:
        return True, response.json(), "", ""
    if response.status_code == 404:
        return False, {}, "", ""
    return False, {}, errors.LOOKUP_FAILED, f"the system answered {response.status_code}"


def _apply_lookup(
    call: ToolCall,
    capability: Capability,
    found: bool,
    body: dict[str, Any],
    error_name: str,
    message: str,
) -> None:
    now = timezone.now()
    call.lookups += 1
    last_attempt = call.attempts.order_by("-number").first()
    sent_at = (last_attempt.ended_at or last_attempt.started_at) if last_attempt else now
    elapsed = (now - sent_at).total_seconds()
    within_window = elapsed < capability.consistency_window
    looked_up = tool_call_event(
        call,
        "tool_call.looked_up",
        {
            "found": found,
            "lookup": call.lookups,
            "within_consistency_window": within_window,
            **({"error_name": error_name, "message": message} if error_name else {}),
            **({"external_id": str(body.get(capability.external_id_field, ""))} if found else {}),
        },
        actor=SYSTEM,
        producer="reconciler",
    )
    if found:
        tool_call_accept(
            call=call,
            capability=capability,
            body=body,
            source=Receipt.Source.LOOKUP,
            status=Receipt.Status.CREATED,
            actor=SYSTEM,
        )
        lifecycle.run_resume_if_unblocked(run_id=call.run_id, actor=SYSTEM, producer="reconciler")
        return
    _after_a_miss(call, capability, error_name, elapsed, within_window)
    if error_name and not within_window and call.execution_status == E.RESULT_UNKNOWN:
        # Unknown past the window and the look-up proved nothing: tell the channels, once.
        channels.call_still_unknown(
            call, event_id=looked_up.pk, since=sent_at, problem=f"{error_name}: {message}"
        )


def _after_a_miss(
    call: ToolCall, capability: Capability, error_name: str, elapsed: float, within_window: bool
) -> None:
    """Nothing found, or the look-up failed: send again only when that proves it absent."""
    if call.execution_status == E.NEEDS_HUMAN:
        call.save(update_fields=["lookups", "updated_at"])
        return  # A person owns it now; a miss changes nothing.
    if error_name == errors.NO_LOOKUP and capability.remote_dedupe_window:
        # No look-up, but the system deduplicates our key: sending again cannot double it.
        gate.tool_call_authorize(
            call=call,
            actor=SYSTEM,
            producer="reconciler",
            reason="no look-up; the system deduplicates this idempotency key",
        )
        return
    if not error_name and not within_window:
        gate.tool_call_authorize(
            call=call,
            actor=SYSTEM,
            producer="reconciler",
            reason=f"look-up found nothing {elapsed:.1f} s after sending, past the "
            f"{capability.consistency_window} s consistency window: never executed",
        )
        return
    if call.lookups >= capability.max_lookups or error_name == errors.NO_LOOKUP:
        tool_call_hand_to_human(
            call=call, reason=f"outcome still unknown after {call.lookups} look-ups"
        )
        return
    wait = capability.consistency_window - elapsed if within_window else 2.0**call.lookups
    call.save(update_fields=["lookups", "updated_at"])
    outbox.enqueue(RECONCILE_TASK, call.pk, countdown=max(wait, 0.5))


def tool_call_hand_to_human(*, call: ToolCall, reason: str, actor: str = SYSTEM) -> None:
    """A person owns the outcome now, and the run waits for them. The call is locked."""
    tool_call_transition(call, "hand_to_human", actor=actor, producer="reconciler", reason=reason)
    lifecycle.run_hand_to_human(
        run_id=call.run_id, actor=actor, producer="reconciler", reason=f"{call.pk}: {reason}"
    )
