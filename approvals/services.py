"""Approver decisions, expiry, escalation and notification.

A decision is a command: it is checked against the approval's current state and against what
the person saw (the version and summary hash their page was rendered with), then recorded as
events in one transaction with the call's transition.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import timezone

from approvals import gate
from approvals.models import Approval, ApprovalDecision, Policy
from runs import events
from runs.canonical import digest
from runs.errors import DomainError, not_found
from runs.models import Run, Tenant, User
from runs.services import actor_for_user, run_transition
from toolcalls import capabilities
from toolcalls import services as calls
from toolcalls.models import E, ToolCall


def _lock(tenant: Tenant, approval_id: str) -> Approval:
    approval = (
        Approval.objects.select_for_update(of=("self",))
        .select_related("run", "tool_call", "policy")
        .filter(tenant=tenant, pk=approval_id)
        .first()
    )
    if approval is None:
        raise not_found("approval", approval_id)
    return approval


def _check_decider(approval: Approval, user: User) -> None:
    if user.tenant_id != approval.tenant_id:
        raise not_found("approval", approval.pk)
    if not user.can_decide:
        raise DomainError("approval.forbidden", "Viewers cannot decide approvals.", status=403)
    if approval.requested_by_id == user.pk:
        raise DomainError(
            "approval.self_approval",
            "You asked for this action (the agent acts for you); someone else must decide.",
            status=403,
        )


def _check_fresh(approval: Approval, seen_version: int, seen_summary_hash: str) -> None:
    """Refuse a decision made on a page that no longer shows the truth, saying what changed."""
    if approval.state != Approval.State.PENDING:
        last = approval.decisions.select_related("user").last()
        who = f" by {last.user.username}" if last else ""
        raise DomainError(
            "approval.already_decided",
            f"This approval is already {approval.state}{who}; nothing was changed.",
        )
    if approval.expires_at <= timezone.now():
        raise DomainError("approval.expired", "This approval has expired; it cannot be decided.")
    if seen_summary_hash != approval.summary_hash:
        raise DomainError(
            "approval.stale",
            "What this approval would do changed since your page was rendered; review it again.",
        )
    if seen_version != approval.version:
        count = approval.decisions.count()
        raise DomainError(
            "approval.stale",
            f"This approval changed since your page was rendered ({count} of "
            f"{approval.required_approvers} approvals now); review it again.",
        )


def _record(approval: Approval, user: User, kind: str, reason: str, diff: dict | None) -> None:
    if approval.decisions.filter(user=user).exists():
        raise DomainError(
            "approval.already_approved_by_you",
            f"You approved already; it needs {approval.required_approvers} different people.",
        )
    ApprovalDecision.objects.create(
        approval=approval,
        user=user,
        decision=kind,
        reason=reason,
        summary_hash=approval.summary_hash,
        edit_diff=diff,
    )
    approvals = approval.decisions.exclude(decision=ApprovalDecision.Kind.REJECT).count()
    events.append(
        run=approval.run,
        event_type="approval.decision_recorded",
        payload={
            "user": user.username,
            "decision": kind,
            "reason": reason,
            "summary_hash": approval.summary_hash,
            **({"edit_diff": diff} if diff else {}),
            "approvals": approvals,
            "required_approvers": approval.required_approvers,
        },
        producer="console",
        actor=actor_for_user(user),
        ids=gate.approval_ids(approval),
    )
    approval.version += 1
    approval.save()


def _resume_run_if_nothing_waits(run_id: str, actor: str) -> None:
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.state != Run.State.WAITING:
        return
    if Approval.objects.filter(run=run, state=Approval.State.PENDING).exists():
        return
    run_transition(run, "resume", actor=actor, producer="console", reason="no approval pending")


@transaction.atomic
def approval_approve(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    reason: str = "",
) -> Approval:
    approval = _lock(tenant, approval_id)
    _check_decider(approval, user)
    _check_fresh(approval, seen_version, seen_summary_hash)
    _record(approval, user, ApprovalDecision.Kind.APPROVE, reason, None)
    _approve_if_quorum(approval, actor_for_user(user))
    return approval


def _approve_if_quorum(approval: Approval, actor: str) -> None:
    approvers = approval.decisions.exclude(decision=ApprovalDecision.Kind.REJECT)
    if approvers.values("user").distinct().count() < approval.required_approvers:
        return
    gate.approval_transition(
        approval, "approve", actor=actor, producer="console", reason="quorum reached"
    )
    call = calls.lock_call(approval.tool_call_id)
    calls.call_authorize(call, actor=actor, producer="console", reason=f"approved ({approval.pk})")
    _resume_run_if_nothing_waits(approval.run_id, actor)


@transaction.atomic
def approval_reject(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    reason: str,
) -> Approval:
    if not reason.strip():
        raise DomainError("approval.reason_required", "Say why you reject it.", status=422)
    approval = _lock(tenant, approval_id)
    _check_decider(approval, user)
    _check_fresh(approval, seen_version, seen_summary_hash)
    actor = actor_for_user(user)
    _record(approval, user, ApprovalDecision.Kind.REJECT, reason, None)
    gate.approval_transition(approval, "reject", actor=actor, producer="console", reason=reason)
    call = calls.lock_call(approval.tool_call_id)
    calls.call_transition(call, "reject", actor=actor, producer="console", reason=reason)
    call.save()
    _resume_run_if_nothing_waits(approval.run_id, actor)
    return approval


def approval_approve_with_edits(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    edits: dict[str, Any],
    reason: str = "",
) -> Approval:
    """Approve different arguments: they are validated like a proposal, get their own digest
    and are judged by the policy again (raising an amount may need more approvers). Returns
    the approval that now stands for the call."""
    approval = Approval.objects.filter(tenant=tenant, pk=approval_id).first()
    if approval is None:
        raise not_found("approval", approval_id)
    capability = capabilities.get(approval.tool_call.capability_id)
    new_args = {**approval.args, **edits}
    problems = capability.validate(new_args) or calls.business_check(tenant, capability, new_args)
    if problems:
        fields = ", ".join(p["field"] for p in problems)
        raise DomainError(
            "tool.validation_failed", f"Fix these fields: {fields}.", status=422, details=problems
        )
    diff = {
        key: {"from": approval.args.get(key), "to": value}
        for key, value in new_args.items()
        if approval.args.get(key) != value
    }
    if not diff:
        return approval_approve(
            tenant=tenant,
            approval_id=approval_id,
            user=user,
            seen_version=seen_version,
            seen_summary_hash=seen_summary_hash,
            reason=reason,
        )
    with transaction.atomic():
        approval = _lock(tenant, approval_id)
        _check_decider(approval, user)
        _check_fresh(approval, seen_version, seen_summary_hash)
        actor = actor_for_user(user)
        _record(approval, user, ApprovalDecision.Kind.APPROVE_WITH_EDITS, reason, diff)
        gate.approval_transition(
            approval,
            "invalidate",
            actor=actor,
            producer="console",
            reason=f"arguments edited by {user.username}",
        )
        call = calls.lock_call(approval.tool_call_id)
        old_digest = call.args_digest
        call.args, call.args_digest = new_args, digest(new_args)
        call.save()
        calls.log_call_event(
            call,
            "tool_call.args_edited",
            {
                "from_digest": old_digest,
                "to_digest": call.args_digest,
                "diff": diff,
                "args": new_args,
                "by": user.username,
            },
            actor=actor,
            producer="console",
        )
        needed = gate.requirement_for(call, capability)
        if needed.approvers == 0:
            calls.call_authorize(
                call, actor=actor, producer="console", reason="edited arguments need no approval"
            )
            _resume_run_if_nothing_waits(call.run_id, actor)
            return approval
        replacement = gate.open_approval(
            call,
            capability,
            needed,
            actor=actor,
            producer="console",
            requested_by=approval.requested_by,
        )
        # The editor approved the new arguments by writing them.
        _record(replacement, user, ApprovalDecision.Kind.APPROVE_WITH_EDITS, reason, diff)
        _approve_if_quorum(replacement, actor)
        return replacement


# --- expiry, escalation, notification -------------------------------------------------------


def expire_due(limit: int = 500) -> int:
    """Expire approvals past their deadline by the database's clock and run the policy's
    fallback. Safe to run twice at once: each approval is locked and re-checked."""
    due = list(
        Approval.objects.filter(state__in=Approval.OPEN_STATES, expires_at__lte=Now()).values_list(
            "pk", "tenant_id"
        )[:limit]
    )
    expired = 0
    for approval_id, tenant_id in due:
        with transaction.atomic():
            approval = _lock(Tenant(pk=tenant_id), approval_id)
            if not approval.is_open or approval.expires_at > timezone.now():
                continue
            actor = "system:expiry"
            gate.approval_transition(
                approval, "expire", actor=actor, producer="beat", reason="deadline passed"
            )
            call = calls.lock_call(approval.tool_call_id)
            if call.execution_status in (E.AWAITING_APPROVAL, E.AUTHORIZED):
                if call.execution_status == E.AUTHORIZED:
                    calls.call_transition(
                        call,
                        "invalidate",
                        actor=actor,
                        producer="beat",
                        reason="its approval expired before dispatch",
                    )
                else:
                    calls.call_transition(
                        call, "expire", actor=actor, producer="beat", reason="approval.expired"
                    )
                call.save()
            run = Run.objects.select_for_update().get(pk=approval.run_id)
            if approval.policy.on_expiry == Policy.OnExpiry.HAND_TO_HUMAN and run.is_open:
                if run.state == Run.State.WAITING:
                    run_transition(
                        run, "resume", actor=actor, producer="beat", reason="approval expired"
                    )
                run_transition(
                    run,
                    "hand_to_human",
                    actor=actor,
                    producer="beat",
                    reason=f"{approval.pk} expired",
                )
            else:
                _resume_run_if_nothing_waits(run.pk, actor)
            expired += 1
    return expired


def escalate_due(limit: int = 200) -> int:
    """Email the escalation group about pending approvals close to expiry, once each."""
    escalated = 0
    candidates = Approval.objects.filter(
        state=Approval.State.PENDING, escalated_at=None
    ).select_related("policy", "run", "tool_call")[:limit]
    for approval in candidates:
        before = timedelta(seconds=approval.policy.escalate_before_seconds)
        if approval.expires_at - before > timezone.now():
            continue
        recipients = [a.strip() for a in approval.policy.escalation_group.split(",") if a.strip()]
        with transaction.atomic():
            # A conditional update: two beats never both escalate it.
            claimed = Approval.objects.filter(pk=approval.pk, escalated_at=None).update(
                escalated_at=timezone.now()
            )
            if not claimed:
                continue
            events.append(
                run=approval.run,
                event_type="approval.escalated",
                payload={"to": recipients, "expires_at": approval.expires_at.isoformat()},
                producer="beat",
                actor="system:escalation",
                ids=gate.approval_ids(approval),
            )
            if recipients:
                transaction.on_commit(
                    lambda a=approval, r=recipients: _mail(
                        a, r, f"Escalation: approval {a.pk} expires soon"
                    )
                )
        escalated += 1
    return escalated


def notify_approvers(approval_id: str) -> int:
    """Email the tenant's approvers a link to the approval page. Once per approval."""
    approval = Approval.objects.select_related("tenant").filter(pk=approval_id).first()
    if approval is None or approval.state != Approval.State.PENDING:
        return 0
    claimed = Approval.objects.filter(pk=approval_id, notified_at=None).update(
        notified_at=timezone.now()
    )
    if not claimed:
        return 0
    recipients = list(
        User.objects.filter(
            tenant=approval.tenant,
            role__in=[User.Role.APPROVER, User.Role.ADMIN],
            is_active=True,
        )
        .exclude(email="")
        .exclude(pk=approval.requested_by_id)
        .values_list("email", flat=True)
    )
    if recipients:
        _mail(approval, recipients, f"Approval needed: {approval.summary}")
    return len(recipients)


def _mail(approval: Approval, recipients: list[str], subject: str) -> None:
    link = settings.COUNTERSIGN_BASE_URL.rstrip("/") + reverse(
        "approvals:detail", args=[approval.pk]
    )
    body = (
        f"{approval.summary}\n\nRisk: {approval.risk}. Rule: {approval.rule_name} "
        f"(policy v{approval.policy_version}). Expires {approval.expires_at:%Y-%m-%d %H:%M} UTC."
        f"\n\nDecide here: {link}\n"
    )
    send_mail(subject[:200], body, None, recipients)


def approval_for_call(call: ToolCall) -> Approval | None:
    return call.approvals.order_by("-created_at").first()
