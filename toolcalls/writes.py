"""The write path of a tool call, shared by every stage (propose, dispatch, reconcile, …).

`tool_call_transition` is the one way either state machine changes: transition, event and
save in the caller's transaction (the contract is in runs/transitions.py). Every stage locks
the call with `tool_call_lock` first.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from runs import events, logcontext, transitions
from runs.errors import DomainError, not_found
from runs.models import Event, Tenant
from toolcalls import capabilities, channels, errors, sql, webhooks
from toolcalls.capabilities import Capability
from toolcalls.event_types import EXECUTION_EVENTS, VERIFICATION_EVENTS
from toolcalls.models import TERMINAL_STATUSES, ToolCall

# Celery task names, enqueued through the outbox (toolcalls/tasks.py runs them).
DISPATCH_TASK = "toolcalls.dispatch"
# The same dispatch for a call a person has just approved, routed to the `interactive` queue
# that workers take from first (CELERY_TASK_ROUTES): the approver is waiting for it.
DISPATCH_APPROVED_TASK = "toolcalls.dispatch_approved"
RECONCILE_TASK = "toolcalls.reconcile"
VERIFY_TASK = "toolcalls.verify"


def tool_call_ids(call: ToolCall) -> events.Ids:
    # Made once per call, kept on it: these ids are fixed at proposal, and a dispatch appends
    # five events about the call (1,000 made per 200 calls, profile_dispatch --profile).
    ids = call.__dict__.get("_event_ids")
    if ids is None:
        ids = call.__dict__["_event_ids"] = events.Ids(
            tool_call_id=call.id,
            capability_id=call.capability_id,
            decision_id=call.decision_id or "",
        )
    return ids


def tool_call_event(
    call: ToolCall, event_type: str, payload: dict[str, Any], *, actor: str, producer: str
) -> Event:
    """An event about the call that is not a transition (a look-up, a deferral, an edit)."""
    return events.append(
        run=call.run,
        event_type=event_type,
        payload=payload,
        producer=producer,
        actor=actor,
        ids=tool_call_ids(call),
    )


def tool_call_transition(
    call: ToolCall, action: str, *, actor: str, producer: str, reason: str = "", **details: Any
) -> None:
    """Apply one transition of either machine, log it and save the call. Set the other
    fields the change needs (errors, lease, result) before calling it. A call that reaches a
    terminal status here is reported to the tenant's webhooks, and one handed to a person to its
    chat channels, in the same transaction."""
    verification = action in VERIFICATION_EVENTS
    status_before = call.agent_status
    # The call's status_since is its event's time, to the microsecond (the desk and /metrics
    # read the dwell from the row, the audit from the log: they agree).
    moment = timezone.now()
    if not verification:
        call.status_since = moment
    event = transitions.apply(
        call,
        action,
        field="verification_status" if verification else "execution_status",
        event_type=VERIFICATION_EVENTS[action] if verification else EXECUTION_EVENTS[action],
        run=call.run,
        actor=actor,
        producer=producer,
        ids=tool_call_ids(call),
        reason=reason,
        refusal=errors.INVALID_STATE,
        at=moment,  # the event's occurred_at and recorded_at: one reading of the clock
        **details,
    )
    status_after = call.agent_status  # once: `is_terminal` would work it out again
    if status_after != status_before and status_after in TERMINAL_STATUSES:
        webhooks.tool_call_terminal(call, event_id=event.id)
    if action == "hand_to_human":
        channels.desk_item_added(call, event_id=event.id, reason=reason)


def tool_call_lock(tool_call_id: str) -> ToolCall | None:
    # FOR NO KEY UPDATE: it excludes every other writer of the call, but not a row that only
    # refers to it (a dependency, an attempt), whose foreign-key check takes KEY SHARE. With
    # FOR UPDATE a proposal holding the run's lock waited at commit for a dispatch holding the
    # call, which waited for the run: a deadlock (manage.py soak). One hand-written statement
    # (toolcalls/sql.py): the ORM's compiling of it was the worker's largest cost.
    call = sql.lock_call(tool_call_id)
    if call is not None:
        bind_log_ids(call)
    return call


def bind_log_ids(call: ToolCall) -> None:
    """From here on the request's or task's log lines and spans name this call (its run and
    tenant must be loaded)."""
    logcontext.bind(
        tenant=call.tenant.slug,
        run_id=call.run_id,
        tool_call_id=call.id,
        correlation_id=call.run.correlation_id,
    )


def tool_call_lock_for_tenant(tenant: Tenant, tool_call_id: str) -> ToolCall:
    call = tool_call_lock(tool_call_id)
    if call is None or call.tenant_id != tenant.pk:
        raise not_found("tool call", tool_call_id)
    return call


def capability_of(call: ToolCall) -> Capability:
    capability = capabilities.get(call.capability_id)
    if capability is None:
        # A contract removed from code while calls still use it: keep them readable, stop work.
        raise DomainError(
            errors.CAPABILITY_UNKNOWN, f"{call.capability_id} is no longer registered."
        )
    return capability


def timeout_of(capability: Capability) -> float:
    return settings.TOOLCALL_TIMEOUT_OVERRIDE or capability.timeout
