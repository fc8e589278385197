"""Celery tasks of approvals: thin, take ids, call a service. (Expiry changes tool calls, so
its task, `approvals.expire`, is in toolcalls/tasks.py.)"""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from approvals import services
from runs import outbox


@shared_task(name="approvals.notify")
def notify(approval_id: str, outbox_id: str | None = None) -> int:
    with transaction.atomic():
        outbox.mark_done(outbox_id)
    return services.approval_notify_approvers(approval_id=approval_id)


@shared_task(name="approvals.escalate")
def escalate() -> int:
    return services.approvals_escalate_due()
