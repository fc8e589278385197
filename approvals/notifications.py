"""Emails about approvals: to the tenant's approvers when one opens, to the policy's
escalation group when one nears its deadline.

Each email is a `Notification` with a send key (`approvers:<approval>`,
`escalation:<approval>`) and goes through the outbox, at least once:

- the task claims the send with a conditional update and a lease, so a second delivery of
  its message (Redis redelivers, the sweeper republishes) leaves it to the first, and leaves
  the message undone in case the first dies;
- it sends, then records `sent_at` in one transaction; a send key already recorded is never
  sent again;
- a send that raises releases the claim and fails the task: its outbox message stays undone
  and the sweeper publishes it again. The message is done only after the send succeeded.

A crash after the mail server took the email and before `sent_at` is recorded sends it once
more when the lease has passed: an email may go twice in that case, never zero times.

Escalation targets: `Policy.escalation_group` is a comma-separated list; a target with an "@"
is an email address, any other names a Django auth group (`/admin/auth/group/`), which stands
for its active members of the approval's tenant who have an address. A target that resolves to
nobody is recorded as unresolved in the `approval.escalated` event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval, Notification
from approvals.services import approval_ids
from runs import events, outbox
from runs.models import User
from runs.money import summary_text

log = logging.getLogger(__name__)

ESCALATION_TASK = "approvals.send_escalation"

# A send is the task's to finish until then. Celery's hard time limit ends any task sooner,
# so a claim older than that belongs to a worker that died mid-send.
SEND_LEASE = timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT + 10)

# Who else hears of an escalation, in its transaction: toolcalls registers its chat channels
# here (toolcalls/channels.py), since this layer may not import the one above it.
_escalation_listeners: list[Callable[[Approval], None]] = []


def on_escalation(listener: Callable[[Approval], None]) -> None:
    """Call `listener(approval)` in the transaction that records each escalation."""
    if listener not in _escalation_listeners:
        _escalation_listeners.append(listener)


# What a send did: the task marks its outbox message done unless another delivery is sending.
SENT, ALREADY_SENT, NOTHING_TO_SEND, BEING_SENT = "sent", "already_sent", "nothing", "busy"


def notification_send(*, send_key: str) -> str:
    """Send the notification once: claim it, send it, record it. Raises what the mail
    backend raised (the claim released, nothing recorded)."""
    now = timezone.now()
    claimed = (
        Notification.objects.filter(send_key=send_key, sent_at=None)
        .filter(Q(claimed_until=None) | Q(claimed_until__lte=now))
        .update(claimed_until=now + SEND_LEASE, attempts=F("attempts") + 1)
    )
    notification = Notification.objects.select_related("approval").filter(send_key=send_key)
    notification = notification.first()
    if notification is None:
        return NOTHING_TO_SEND
    if not claimed:
        return ALREADY_SENT if notification.sent_at else BEING_SENT
    try:
        if notification.recipients:
            _mail(notification)
    except Exception:
        Notification.objects.filter(pk=notification.pk).update(claimed_until=None)
        raise
    with transaction.atomic():
        Notification.objects.filter(pk=notification.pk).update(sent_at=timezone.now())
        if notification.kind == Notification.Kind.APPROVERS:
            Approval.objects.filter(pk=notification.approval_id).update(notified_at=timezone.now())
    return SENT


def _mail(notification: Notification) -> None:
    approval = notification.approval
    link = settings.COUNTERSIGN_BASE_URL.rstrip("/") + reverse(
        "approvals:detail", args=[approval.pk]
    )
    # The stored summary writes amounts as the contract does ("1200.00 USD"); people read money.
    summary = summary_text(approval.summary, approval.args)
    body = (
        f"{summary}\n\nRisk: {approval.risk}. Rule: {approval.rule_name} "
        f"(policy v{approval.policy_version}). Expires {approval.expires_at:%Y-%m-%d %H:%M} UTC."
        f"\n\nDecide here: {link}\n"
    )
    send_mail(notification.subject, body, None, notification.recipients)


# --- the approvers --------------------------------------------------------------------------


def approval_notify_approvers(*, approval_id: str) -> str:
    """Email the tenant's approvers (not the person the agent acts for) a link to the
    approval page, once. An approval no longer pending when the task first runs needs none."""
    send_key = f"approvers:{approval_id}"
    if not Notification.objects.filter(send_key=send_key).exists():
        approval = Approval.objects.filter(pk=approval_id).first()
        if approval is None or approval.state != Approval.State.PENDING:
            return NOTHING_TO_SEND
        recipients = list(
            User.objects.filter(
                tenant_id=approval.tenant_id,
                role__in=[User.Role.APPROVER, User.Role.ADMIN],
                is_active=True,
            )
            .exclude(email="")
            .exclude(pk=approval.requested_by_id)
            .order_by("username")
            .values_list("email", flat=True)
        )
        subject = f"Approval needed: {summary_text(approval.summary, approval.args)}"
        _create(approval, send_key, Notification.Kind.APPROVERS, recipients, subject)
    return notification_send(send_key=send_key)


def _create(
    approval: Approval, send_key: str, kind: str, recipients: list[str], subject: str
) -> None:
    try:
        with transaction.atomic():
            Notification.objects.create(
                send_key=send_key,
                approval=approval,
                kind=kind,
                recipients=recipients,
                subject=subject[:200],
            )
    except IntegrityError:
        pass  # another delivery wrote it first: the same email


# --- escalation -----------------------------------------------------------------------------


def escalation_recipients(approval: Approval) -> tuple[list[str], list[str]]:
    """The addresses the policy's escalation group names for this approval, each once (in the
    order written, a group's members by username), and the targets that named nobody."""
    addresses: dict[str, str] = {}
    unresolved = []
    for target in (t.strip() for t in approval.policy.escalation_group.split(",")):
        if not target:
            continue
        if "@" in target:
            found = [target]
        else:
            found = list(
                User.objects.filter(
                    groups__name=target, tenant_id=approval.tenant_id, is_active=True
                )
                .exclude(email="")
                .order_by("username")
                .values_list("email", flat=True)
            )
        if not found:
            unresolved.append(target)
        for address in found:
            addresses.setdefault(address.lower(), address)
    return list(addresses.values()), unresolved


def approvals_escalate_due(*, limit: int = 200) -> int:
    """Escalate pending approvals close to expiry, once each: record it (`escalated_at`, the
    `approval.escalated` event) and its email, whose sending the outbox then owns."""
    escalated = 0
    candidates = Approval.objects.filter(
        state=Approval.State.PENDING, escalated_at=None
    ).select_related("policy", "run", "tool_call")[:limit]
    for approval in candidates:
        before = timedelta(seconds=approval.policy.escalate_before_seconds)
        if approval.expires_at - before > timezone.now():
            continue
        recipients, unresolved = escalation_recipients(approval)
        with transaction.atomic():
            # A conditional update: two beats never both escalate it.
            claimed = Approval.objects.filter(pk=approval.pk, escalated_at=None).update(
                escalated_at=timezone.now()
            )
            if not claimed:
                continue
            payload = {"to": recipients, "expires_at": approval.expires_at.isoformat()}
            events.append(
                run=approval.run,
                event_type="approval.escalated",
                payload={**payload, **({"unresolved": unresolved} if unresolved else {})},
                producer="beat",
                actor="system:escalation",
                ids=approval_ids(approval),
            )
            if recipients:
                Notification.objects.create(
                    send_key=f"escalation:{approval.pk}",
                    approval=approval,
                    kind=Notification.Kind.ESCALATION,
                    recipients=recipients,
                    subject=f"Escalation: approval {approval.pk} expires soon",
                )
                outbox.enqueue(ESCALATION_TASK, approval.pk)
            for listener in _escalation_listeners:
                listener(approval)
        if unresolved:
            log.warning("escalation of %s: %s named nobody", approval.pk, ", ".join(unresolved))
        escalated += 1
    return escalated


def approval_send_escalation(*, approval_id: str) -> str:
    return notification_send(send_key=f"escalation:{approval_id}")
