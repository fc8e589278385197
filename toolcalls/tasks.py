"""Celery tasks: thin, take ids, call a service. Retries are the services' business (one owner
of retries), so no task here uses Celery's autoretry."""

from __future__ import annotations

from celery import shared_task

from runs.faults import crashpoint
from toolcalls import services


@shared_task(name="toolcalls.dispatch")
def dispatch_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    services.dispatch(tool_call_id, outbox_id=outbox_id)
    crashpoint("before_ack")


@shared_task(name="toolcalls.reconcile")
def reconcile_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    services.reconcile(tool_call_id, outbox_id=outbox_id)


@shared_task(name="toolcalls.verify")
def verify_tool_call(tool_call_id: str, outbox_id: str | None = None) -> None:
    services.verify(tool_call_id, outbox_id=outbox_id)


@shared_task(name="toolcalls.sweep_leases")
def sweep_leases() -> int:
    return services.sweep_expired_leases() + services.sweep_waiting_dependents()
