"""Celery tasks: thin, take ids, call a service. Retries are the services' business (one owner
of retries), so no task here uses Celery's autoretry."""

from __future__ import annotations

from celery import shared_task

from runs.faults import crashpoint
from toolcalls import dispatch, gate, reconcile, sweeps, verify, webhooks


@shared_task(name="toolcalls.dispatch")
def dispatch_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    dispatch.tool_call_dispatch(tool_call_id=tool_call_id, outbox_id=outbox_id)
    crashpoint("before_ack")


# The same service; only the queue differs (settings: CELERY_TASK_ROUTES).
@shared_task(name="toolcalls.dispatch_approved")
def dispatch_approved_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    dispatch.tool_call_dispatch(tool_call_id=tool_call_id, outbox_id=outbox_id)
    crashpoint("before_ack")


@shared_task(name="toolcalls.reconcile")
def reconcile_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    reconcile.tool_call_reconcile(tool_call_id=tool_call_id, outbox_id=outbox_id)


@shared_task(name="toolcalls.verify")
def verify_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    verify.tool_call_verify(tool_call_id=tool_call_id, outbox_id=outbox_id)


@shared_task(name="toolcalls.deliver_webhook")
def deliver_webhook(delivery_id: str, outbox_id: str | None = None) -> None:
    webhooks.webhook_deliver(delivery_id=delivery_id, outbox_id=outbox_id)


@shared_task(name="toolcalls.approval_decided_webhooks")
def approval_decided_webhooks(approval_id: str, outbox_id: str | None = None) -> None:
    webhooks.approval_decided_fan_out(approval_id=approval_id, outbox_id=outbox_id)


@shared_task(name="toolcalls.sweep_leases")
def sweep_leases() -> int:
    return sweeps.leases_sweep_expired() + sweeps.dependents_sweep_waiting()


# Named in the approvals namespace (beat schedules it by this name), run here: expiring an
# approval changes its tool call, and approvals never imports toolcalls.
@shared_task(name="approvals.expire")
def expire_approvals() -> int:
    return gate.approvals_expire_due()
