"""Beat's sweeps over tool calls: expired leases become unknown outcomes, and calls waiting on
settled dependencies are woken (DESIGN section 6). Due approvals are expired by
`gate.approvals_expire_due`, which follows each to its call."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from runs import outbox
from toolcalls import errors
from toolcalls.models import Attempt, E, ToolCall
from toolcalls.writes import DISPATCH_TASK, RECONCILE_TASK, tool_call_lock, tool_call_transition


def leases_sweep_expired(*, limit: int = 500) -> int:
    """A worker that died mid-call leaves its lease to expire: its call is unknown, not
    "never called", and goes to reconciliation."""
    now = timezone.now()
    expired = list(
        ToolCall.objects.filter(
            execution_status=E.DISPATCHING, lease_expires_at__lt=now
        ).values_list("pk", flat=True)[:limit]
    )
    swept = 0
    for tool_call_id in expired:
        with transaction.atomic():
            call = tool_call_lock(tool_call_id)
            if call.execution_status != E.DISPATCHING or call.lease_expires_at >= now:
                continue
            Attempt.objects.filter(
                tool_call=call,
                fencing_token=call.fencing_token,
                classification=Attempt.Classification.IN_FLIGHT,
            ).update(
                classification=Attempt.Classification.UNKNOWN,
                error_name=errors.LEASE_EXPIRED,
                ended_at=now,
            )
            call.lease_expires_at = None
            call.last_error_name = errors.LEASE_EXPIRED
            call.last_error_message = "the worker's lease expired; it may have sent the request"
            tool_call_transition(
                call,
                "mark_unknown",
                actor="system:sweeper",
                producer="sweeper",
                error_name=errors.LEASE_EXPIRED,
                message=call.last_error_message,
            )
            outbox.enqueue(RECONCILE_TASK, call.pk)
            swept += 1
    return swept


def dependents_sweep_waiting(*, limit: int = 500) -> int:
    """Authorized calls waiting on dependencies that have all settled (a failure cancels
    them at their claim, a success dispatches them): send each a dispatch."""
    waiting = (
        ToolCall.objects.filter(execution_status=E.AUTHORIZED, depends_on__isnull=False)
        .distinct()
        .prefetch_related("depends_on")[:limit]
    )
    woken = 0
    for call in waiting:
        if all(dependency.is_settled for dependency in call.depends_on.all()):
            with transaction.atomic():
                outbox.enqueue(DISPATCH_TASK, call.pk)
            woken += 1
    return woken
