"""Where approvals meet tool calls: asking for one at proposal, checking it before dispatch.

Called by toolcalls.services inside its transactions, with the call locked.
"""

from __future__ import annotations

from datetime import timedelta
from hashlib import sha256

from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from approvals.event_types import APPROVAL_EVENTS
from approvals.models import Approval
from approvals.policies import Requirement, current_policy, requirement
from runs import events, outbox, transitions
from runs.models import Run, User
from toolcalls.capabilities import Capability
from toolcalls.models import ToolCall

NOTIFY_TASK = "approvals.notify"


def requirement_for(call: ToolCall, capability: Capability) -> Requirement:
    return requirement(current_policy(call.tenant, call.capability_id), call.args, capability.risk)


def summary_hash(summary: str, args_digest: str) -> str:
    """What an approver is shown, in one hash: the words and the exact arguments."""
    return sha256(f"{summary}\n{args_digest}".encode()).hexdigest()


def approval_ids(approval: Approval) -> events.Ids:
    call = approval.tool_call
    return events.Ids(
        approval_id=approval.pk,
        tool_call_id=call.pk,
        capability_id=call.capability_id,
        decision_id=call.decision_id or "",
    )


def approval_transition(
    approval: Approval, action: str, *, actor: str, producer: str, reason: str = "", **details
) -> None:
    transitions.apply(
        approval,
        action,
        field="state",
        event_type=APPROVAL_EVENTS[action],
        run=approval.run,
        actor=actor,
        producer=producer,
        ids=approval_ids(approval),
        reason=reason,
        refusal="approval.invalid_state",
        **details,
    )
    approval.version += 1
    approval.save()


def open_approval(
    call: ToolCall,
    capability: Capability,
    needed: Requirement,
    *,
    actor: str,
    producer: str,
    requested_by: User | None,
) -> Approval:
    """Ask people: bind an approval to this call's exact arguments, object revision, scope,
    policy version and expiry, and notify the tenant's approvers after commit."""
    summary = capability.summary(call.args)
    approval = Approval.objects.create(
        tenant_id=call.tenant_id,
        run_id=call.run_id,
        tool_call=call,
        args=call.args,
        args_digest=call.args_digest,
        object_ref=call.object_ref,
        object_revision=call.object_revision,
        permission=capability.permission,
        policy=needed.policy,
        policy_version=needed.policy.version,
        rule_name=needed.rule_name,
        risk=needed.risk,
        required_approvers=needed.approvers,
        summary=summary,
        summary_hash=summary_hash(summary, call.args_digest),
        requested_by=requested_by,
        expires_at=timezone.now() + timedelta(seconds=needed.policy.expiry_seconds),
    )
    events.append(
        run=call.run,
        event_type="approval.required",
        payload={
            "policy_version": approval.policy_version,
            "rule": approval.rule_name,
            "required_approvers": approval.required_approvers,
            "expires_at": approval.expires_at.isoformat(),
            "args_digest": approval.args_digest,
            "summary_hash": approval.summary_hash,
            "summary": summary,
            "risk": approval.risk,
            "object_ref": approval.object_ref,
            "object_revision": approval.object_revision,
            "permission": approval.permission,
            "requested_by": requested_by.username if requested_by else "",
        },
        producer=producer,
        actor=actor,
        ids=approval_ids(approval),
    )
    run = Run.objects.select_for_update().get(pk=call.run_id)
    if run.state == Run.State.ACTIVE:
        from runs.services import run_transition

        run_transition(
            run, "wait", actor=actor, producer=producer, reason=f"{approval.pk} waits for approval"
        )
    outbox.enqueue(NOTIFY_TASK, approval.pk)
    return approval


def admit_dispatch(call: ToolCall, capability: Capability, actor: str) -> str | tuple[str, str]:
    """Before a dispatch: "ok", "needs_approval" (ask people again), or (error name, message)
    to fail the call. Consumes an approved approval with a conditional update: once."""
    needed = requirement_for(call, capability)
    if needed.approvers == 0:
        return "ok"  # the current policy asks nobody for these arguments
    latest = call.approvals.order_by("-created_at").first()
    if latest is None:
        return "needs_approval"
    if latest.state == Approval.State.CONSUMED:
        # The same operation again (a look-up proved it absent): the approval still covers
        # it unless the arguments, the object or the policy's demand changed.
        unchanged = (
            latest.args_digest == call.args_digest
            and latest.object_revision == call.object_revision
            and needed.approvers <= latest.required_approvers
        )
        return "ok" if unchanged else "needs_approval"
    if latest.state != Approval.State.APPROVED:
        return "approval.not_approved", f"approval {latest.pk} is {latest.state}"
    if needed.approvers > latest.required_approvers:
        approval_transition(
            latest,
            "invalidate",
            actor=actor,
            producer="dispatcher",
            reason="the policy now asks for more approvers",
        )
        return "needs_approval"
    consumed = Approval.objects.filter(
        pk=latest.pk,
        state=Approval.State.APPROVED,
        args_digest=call.args_digest,
        expires_at__gt=Now(),
    ).update(state=Approval.State.CONSUMED, version=F("version") + 1)
    if consumed == 1:
        latest.refresh_from_db()
        events.append(
            run=call.run,
            event_type="approval.consumed",
            payload={"from": "approved", "to": "consumed", "reason": "dispatch"},
            producer="dispatcher",
            actor=actor,
            ids=approval_ids(latest),
        )
        return "ok"
    latest.refresh_from_db()
    if latest.expires_at <= timezone.now():
        approval_transition(
            latest, "expire", actor=actor, producer="dispatcher", reason="expired before dispatch"
        )
        return "approval.expired", f"approval {latest.pk} expired before dispatch"
    approval_transition(
        latest,
        "invalidate",
        actor=actor,
        producer="dispatcher",
        reason="the arguments changed since approval",
    )
    return "needs_approval"


def invalidate_for_object(call: ToolCall, new_revision_of: str, actor: str) -> None:
    """A write changed `new_revision_of`: approvals bound to its older revision no longer
    describe reality. They are invalidated, and their calls with them (the agent proposes
    again from the new revision)."""
    stale = (
        Approval.objects.select_for_update()
        .select_related("run", "tool_call")
        .filter(
            tenant_id=call.tenant_id,
            object_ref=new_revision_of,
            state__in=Approval.OPEN_STATES,
            object_revision__isnull=False,
        )
        .exclude(tool_call=call)
    )
    for approval in stale:
        approval_transition(
            approval,
            "invalidate",
            actor=actor,
            producer="dispatcher",
            reason=f"{new_revision_of} changed (by {call.pk})",
        )
        other = approval.tool_call
        if other.execution_status in ("awaiting_approval", "authorized"):
            transitions.apply(
                other,
                "invalidate",
                field="execution_status",
                event_type="tool_call.invalidated",
                run=other.run,
                actor=actor,
                producer="dispatcher",
                reason=f"{new_revision_of} changed (by {call.pk})",
                ids=events.Ids(tool_call_id=other.pk, capability_id=other.capability_id),
                refusal="tool_call.invalid_state",
            )
            other.save()
