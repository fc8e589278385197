"""Where approvals meet tool calls: asking people at proposal, checking the approval before
dispatch, and acting on what people decided.

The approvals app below records policies, approvals and decisions and never touches a tool
call. Every effect of an approval on its call goes through one function here,
`tool_call_follow_approval`: approved → authorized, rejected → rejected, expired → expired
(and the policy's fallback for the run). The commands people use (approve, reject, approve
with edits) lock the approval and the call, record the decision with approvals' services and
then follow it, all in one transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from approvals import errors as approval_errors
from approvals import services as approvals
from approvals.models import Approval, ApprovalDecision, Policy
from approvals.policies import Requirement, current_policy, requirement
from runs import events, logcontext, outbox, pipeline
from runs.canonical import digest
from runs.errors import DomainError, not_found
from runs.models import OutboxMessage, Tenant, User
from runs.services import actor_for_user
from toolcalls import capabilities, channels, errors, lifecycle, sql_decision, webhooks
from toolcalls.capabilities import Capability
from toolcalls.capabilities.base import OpenCall
from toolcalls.checks import KnownOpenCalls, arguments_check, business_check, edits_check
from toolcalls.models import E, ToolCall
from toolcalls.writes import (
    DISPATCH_APPROVED_TASK,
    DISPATCH_TASK,
    bind_log_ids,
    tool_call_event,
    tool_call_transition,
)


def requirement_for(
    call: ToolCall, capability: Capability, newest_policy_id: int | None = None
) -> Requirement:
    """`newest_policy_id`: the id of the newest policy, when the caller read it already (the
    row may then come from the cache)."""
    policy = current_policy(call.tenant, call.capability_id, newest_id=newest_policy_id)
    return requirement(policy, call.args, capability.risk)


def tool_call_authorize(
    *,
    call: ToolCall,
    actor: str,
    producer: str,
    reason: str,
    task: str = DISPATCH_TASK,
    write_message: bool = True,
    **details: Any,
) -> OutboxMessage:
    """Authorized: dispatch it (at `next_attempt_at` when a retry waits). `task`: which
    dispatch task, hence which queue (DISPATCH_APPROVED_TASK when a person just approved).
    Returns the dispatch's outbox message; with `write_message=False` the caller writes it
    (outbox.enqueue's `write`)."""
    tool_call_transition(
        call, "authorize", actor=actor, producer=producer, reason=reason, **details
    )
    countdown = 0.0
    if call.next_attempt_at:
        countdown = max(0.0, (call.next_attempt_at - timezone.now()).total_seconds())
    return outbox.enqueue(task, call.pk, countdown=countdown, write=write_message)


def tool_call_hold_for_approval(
    *,
    call: ToolCall,
    capability: Capability,
    needed: Requirement,
    actor: str,
    producer: str,
    reason: str,
    requested_by: User | None,
) -> Approval:
    """The policy asks people: the call waits in awaiting_approval, bound to a new approval,
    and its run waits with it."""
    if call.execution_status != E.AWAITING_APPROVAL:
        tool_call_transition(
            call, "request_approval", actor=actor, producer=producer, reason=reason
        )
    approval = approvals.approval_open(
        call=call,
        summary=capability.summary(call.args),
        permission=capability.permission,
        needed=needed,
        actor=actor,
        producer=producer,
        requested_by=requested_by,
    )
    logcontext.bind(approval_id=approval.pk)
    channels.approval_requested(approval, call)
    lifecycle.run_wait_for_approval(
        run_id=call.run_id, approval_id=approval.pk, actor=actor, producer=producer
    )
    return approval


def tool_call_admit(
    *, call: ToolCall, capability: Capability, actor: str, newest_policy_id: int | None = None
) -> str | tuple[str, str]:
    """Before a dispatch: "ok", "needs_approval" (ask people again), or (error name, message)
    to fail the call. Consumes an approved approval: once."""
    needed = requirement_for(call, capability, newest_policy_id)
    if needed.approvers == 0:
        return "ok"  # the current policy asks nobody for these arguments
    # Locked and read in one statement: approval_consume below needs it locked (the caller
    # holds the call's lock, so no other claim reads it meanwhile).
    latest = sql_decision.lock_latest_approval(call)
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
        return approval_errors.NOT_APPROVED, f"approval {latest.pk} is {latest.state}"
    if needed.approvers > latest.required_approvers:
        approvals.approval_transition(
            latest,
            "invalidate",
            actor=actor,
            producer="dispatcher",
            reason="the policy now asks for more approvers",
        )
        return "needs_approval"
    consumed = approvals.approval_consume(
        approval=latest, args_digest=call.args_digest, actor=actor
    )
    if consumed == "consumed":
        return "ok"
    if consumed == "expired":
        approvals.approval_transition(
            latest, "expire", actor=actor, producer="dispatcher", reason="expired before dispatch"
        )
        return approval_errors.EXPIRED, f"approval {latest.pk} expired before dispatch"
    approvals.approval_transition(
        latest,
        "invalidate",
        actor=actor,
        producer="dispatcher",
        reason="the arguments changed since approval",
    )
    return "needs_approval"


def approvals_invalidate_for_object(*, call: ToolCall, object_ref: str, actor: str) -> None:
    """A write changed `object_ref`: approvals bound to its older revision no longer describe
    reality. They are invalidated, and their calls with them (the agent proposes again from
    the new revision)."""
    stale = (
        Approval.objects.select_for_update()
        .select_related("run", "tool_call")
        .filter(
            tenant_id=call.tenant_id,
            object_ref=object_ref,
            state__in=Approval.OPEN_STATES,
            object_revision__isnull=False,
        )
        .exclude(tool_call=call)
    )
    reason = f"{object_ref} changed (by {call.pk})"
    for approval in stale:
        approvals.approval_transition(
            approval, "invalidate", actor=actor, producer="dispatcher", reason=reason
        )
        other = approval.tool_call
        if other.execution_status in (E.AWAITING_APPROVAL, E.AUTHORIZED):
            tool_call_transition(
                other, "invalidate", actor=actor, producer="dispatcher", reason=reason
            )


def tool_call_follow_approval(
    *,
    approval: Approval,
    call: ToolCall,
    actor: str,
    producer: str,
    reason: str = "",
    decided_wanted: bool | None = None,
) -> None:
    """The one way an approval's state reaches its tool call (both locked, in a transaction):
    approved → authorized; rejected → rejected; expired → expired (or invalidated when it
    was authorized and not yet sent), then the policy's fallback for the run. Still pending
    (1 of 2 approvers so far): nothing changes. `decided_wanted`: whether a receiver wants
    the decision, when the caller's lock read it (None: asked here)."""
    if approval.state == Approval.State.APPROVED:
        tool_call_authorize(
            call=call,
            actor=actor,
            producer=producer,
            reason=reason or f"approved ({approval.pk})",
            task=DISPATCH_APPROVED_TASK,
        )
        webhooks.approval_decided(approval, call, wanted=decided_wanted)
    elif approval.state == Approval.State.REJECTED:
        tool_call_transition(call, "reject", actor=actor, producer=producer, reason=reason)
        webhooks.approval_decided(approval, call, wanted=decided_wanted)
    elif approval.state == Approval.State.EXPIRED:
        if call.execution_status == E.AUTHORIZED:
            tool_call_transition(
                call,
                "invalidate",
                actor=actor,
                producer=producer,
                reason="its approval expired before dispatch",
            )
        elif call.execution_status == E.AWAITING_APPROVAL:
            tool_call_transition(
                call, "expire", actor=actor, producer=producer, reason=approval_errors.EXPIRED
            )
        if approval.policy.on_expiry == Policy.OnExpiry.HAND_TO_HUMAN:
            reason = f"{approval.pk} expired"
            run = lifecycle.run_hand_to_human(
                run_id=call.run_id, actor=actor, producer=producer, reason=reason
            )
            if run is not None:
                # Not when a call's hand-over moves the run (reconcile.py): that call's own
                # desk item is the message.
                channels.desk_run_added(run, reason=reason)
            return
    else:
        return
    known = lifecycle.decided_run(approval, call)  # the decision's: nothing read again
    lifecycle.run_resume_if_unblocked(
        run_id=call.run_id, actor=actor, producer=producer, known=known
    )


# --- people's commands ----------------------------------------------------------------------


def _lock_both(tenant: Tenant, approval_id: str) -> sql_decision.DecisionLock:
    # One statement (toolcalls/sql_decision.py) locks the approval, its call and its run, and
    # asks whether a receiver wants the decision: the approver waits for this transaction.
    locked = sql_decision.lock_for_decision(tenant_id=tenant.pk, approval_id=approval_id)
    if locked is None:
        raise not_found("approval", approval_id)
    bind_log_ids(locked.call)
    return locked


def _approval_to_decide(
    tenant: Tenant, approval_id: str, user: User, seen: dict[str, Any]
) -> tuple[Approval, Capability | None, KnownOpenCalls]:
    """The approval as the person's decision finds it, before anything is locked: refused
    early (who, which page) so that no check reaches an external system for nothing. The
    locked transaction checks the same again. Read with it, in one statement: the open calls
    on its object that the business check counts."""
    read = sql_decision.decision_read(tenant_id=tenant.pk, approval_id=approval_id)
    if read is None:
        raise not_found("approval", approval_id)
    approval, call = read.approval, read.approval.tool_call
    approvals.approval_check_decision(approval=approval, user=user, **seen)
    known = (call.capability_id, call.object_ref, [OpenCall(*row) for row in read.open_calls])
    return approval, capabilities.get(call.capability_id), known


def _check_still_passes(
    tenant: Tenant,
    approval: Approval,
    capability: Capability | None,
    known: KnownOpenCalls | None = None,
) -> None:
    """What was true at proposal may not be now (another refund of the order went out, or is
    on its way): the business check runs again, against the external system and our other
    calls on the object, and a call that would fail there is not approved. Outside any lock:
    it reads the external system."""
    if capability is None:
        return  # its contract left the code: dispatch fails it as capability.unknown
    problems = business_check(
        tenant, capability, approval.args, exclude=approval.tool_call_id, known_open_calls=known
    )
    if problems:
        raise DomainError(
            approval_errors.CHECK_FAILED,
            f"Not approved: the call would fail at {capability.system} now (the problems are "
            "listed). Reject it, or approve it with edits that pass.",
            status=409,
            details=problems,
        )


def tool_call_approve(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    reason: str = "",
) -> Approval:
    """Approve the call as it stands, if it still passes its business check."""
    seen = {"seen_version": seen_version, "seen_summary_hash": seen_summary_hash}
    approval, capability, known = _approval_to_decide(tenant, approval_id, user, seen)
    _check_still_passes(tenant, approval, capability, known)
    return _approve(tenant=tenant, approval_id=approval_id, user=user, reason=reason, **seen)


@transaction.atomic
def _approve(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    reason: str = "",
) -> Approval:
    locked = _lock_both(tenant, approval_id)
    approval, call = locked.approval, locked.call
    approvals.approval_check_decision(
        approval=approval, user=user, seen_version=seen_version, seen_summary_hash=seen_summary_hash
    )
    # The decision's four events (decision, approved, authorized, run resumed) share one read
    # of the run's chain head and one INSERT: the approver waits for this transaction. The
    # run's lock was taken with the approval's (_lock_both): the read does not take it again.
    # After the reads, its writes go to the database in one round trip (runs/pipeline.py).
    with pipeline.writes_together(), events.batch(held=[call.run_id]):
        approvals.approval_approve(approval=approval, user=user, reason=reason)
        tool_call_follow_approval(
            approval=approval,
            call=call,
            actor=actor_for_user(user),
            producer="console",
            decided_wanted=locked.decided_wanted,
        )
    return approval


@transaction.atomic
def tool_call_reject(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    reason: str,
) -> Approval:
    locked = _lock_both(tenant, approval_id)
    approval, call = locked.approval, locked.call
    approvals.approval_check_decision(
        approval=approval, user=user, seen_version=seen_version, seen_summary_hash=seen_summary_hash
    )
    # Locked with the approval (_lock_both); the writes in one round trip, as _approve's.
    with pipeline.writes_together(), events.batch(held=[call.run_id]):
        approvals.approval_reject(approval=approval, user=user, reason=reason)
        tool_call_follow_approval(
            approval=approval,
            call=call,
            actor=actor_for_user(user),
            producer="console",
            reason=reason,
            decided_wanted=locked.decided_wanted,
        )
    return approval


def tool_call_approve_with_edits(
    *,
    tenant: Tenant,
    approval_id: str,
    user: User,
    seen_version: int,
    seen_summary_hash: str,
    edits: dict[str, Any],
    reason: str = "",
) -> Approval:
    """Approve different arguments: never the fields that identify the object (the call keeps
    its object, revision and key), each value exactly of its schema's type; then they are
    validated like a proposal, get their own digest and are judged by the policy again
    (raising an amount may need more approvers). The call's arguments are replaced in place
    (the old ones stay in its events). Returns the approval that now stands for the call."""
    seen = {"seen_version": seen_version, "seen_summary_hash": seen_summary_hash}
    approval, capability, _ = _approval_to_decide(tenant, approval_id, user, seen)
    if capability is None:
        raise DomainError(
            errors.CAPABILITY_UNKNOWN,
            f"{approval.tool_call.capability_id} is no longer a capability here; reject it.",
        )
    edits_check(capability, approval.args, edits)
    new_args = {**approval.args, **edits}
    arguments_check(tenant, capability, new_args, exclude=approval.tool_call_id)
    diff = {
        key: {"from": approval.args.get(key), "to": value}
        for key, value in new_args.items()
        if approval.args.get(key) != value
    }
    if not diff:
        return _approve(tenant=tenant, approval_id=approval_id, user=user, reason=reason, **seen)
    with transaction.atomic():
        locked = _lock_both(tenant, approval_id)
        approval, call = locked.approval, locked.call
        approvals.approval_check_decision(approval=approval, user=user, **seen)
        approvals.approval_record_edit(approval=approval, user=user, reason=reason, diff=diff)
        _replace_args(call, new_args, diff, actor=actor_for_user(user), by=user.username)
        return _ask_again_after_edit(locked, capability, user, reason, diff)


def _ask_again_after_edit(
    locked: sql_decision.DecisionLock, capability: Capability, user: User, reason: str, diff: dict
) -> Approval:
    """The policy judges the edited arguments: no approver needed → authorized; otherwise a
    new approval, which the editor has approved by writing the edit."""
    approval, call, wanted = locked.approval, locked.call, locked.decided_wanted
    actor = actor_for_user(user)
    needed = requirement_for(call, capability)
    if needed.approvers == 0:
        tool_call_authorize(
            call=call,
            actor=actor,
            producer="console",
            reason="edited arguments need no approval",
            task=DISPATCH_APPROVED_TASK,
        )
        webhooks.approval_decided(approval, call, wanted=wanted)
        lifecycle.run_resume_if_unblocked(run_id=call.run_id, actor=actor, producer="console")
        return approval
    replacement = tool_call_hold_for_approval(
        call=call,
        capability=capability,
        needed=needed,
        actor=actor,
        producer="console",
        reason="arguments edited",
        requested_by=approval.requested_by,
    )
    approvals.approval_record_decision(
        approval=replacement,
        user=user,
        kind=ApprovalDecision.Kind.APPROVE_WITH_EDITS,
        reason=reason,
        diff=diff,
    )
    approvals.approval_approve_if_quorum(approval=replacement, actor=actor)
    tool_call_follow_approval(
        approval=replacement, call=call, actor=actor, producer="console", decided_wanted=wanted
    )
    return replacement


def _replace_args(call: ToolCall, new_args: dict, diff: dict, *, actor: str, by: str) -> None:
    old_digest = call.args_digest
    call.args, call.args_digest = new_args, digest(new_args)
    call.save(update_fields=["args", "args_digest", "updated_at"])
    tool_call_event(
        call,
        "tool_call.args_edited",
        {
            "from_digest": old_digest,
            "to_digest": call.args_digest,
            "diff": diff,
            "args": new_args,
            "by": by,
        },
        actor=actor,
        producer="console",
    )


def approvals_expire_due(*, limit: int = 500) -> int:
    """Expire approvals past their deadline and follow each to its call (the policy's
    fallback). Safe to run twice at once: each approval is locked and re-checked."""
    due = list(
        # By the database's clock: every web and beat process agrees on it.
        Approval.objects.filter(state__in=Approval.OPEN_STATES, expires_at__lte=Now()).values_list(
            "pk", "tenant_id"
        )[:limit]
    )
    expired = 0
    for approval_id, tenant_id in due:
        with transaction.atomic():
            locked = _lock_both(Tenant(pk=tenant_id), approval_id)
            approval, call = locked.approval, locked.call
            if not approval.is_open or approval.expires_at > timezone.now():
                continue
            actor = "system:expiry"
            approvals.approval_transition(
                approval, "expire", actor=actor, producer="beat", reason="deadline passed"
            )
            tool_call_follow_approval(approval=approval, call=call, actor=actor, producer="beat")
            expired += 1
    return expired
