"""Celery tasks of approvals: thin, take ids, call a service. (Expiry changes tool calls, so
its task, `approvals.expire`, is in toolcalls/tasks.py.)"""

from __future__ import annotations

from celery import shared_task

from approvals import notifications
from runs import outbox


def _done_after(outcome: str, outbox_id: str | None) -> str:
    """An email's message is done once it is sent (or needs no send); not while another
    delivery of it is sending, in case that one dies."""
    if outcome != notifications.BEING_SENT:
        outbox.mark_done(outbox_id)
    return outcome


@shared_task(name="approvals.notify")
def notify(approval_id: str, outbox_id: str | None = None) -> str:
    return _done_after(notifications.approval_notify_approvers(approval_id=approval_id), outbox_id)


@shared_task(name="approvals.send_escalation")
def send_escalation(approval_id: str, outbox_id: str | None = None) -> str:
    return _done_after(notifications.approval_send_escalation(approval_id=approval_id), outbox_id)


@shared_task(name="approvals.escalate")
def escalate() -> int:
    return notifications.approvals_escalate_due()
