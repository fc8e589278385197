"""Approval writes: open one, record people's decisions, and the approval's own transitions.

This app is below toolcalls and never imports it: these functions change approvals only.
What a decision means for the tool call (authorize it, reject it, ask again after an edit) is
decided in toolcalls/gate.py, which calls these inside its transactions and acts on the result.

A decision is a command: it is checked against the approval's current state and against what
the person saw (the version and summary hash their page was rendered with).
"""

from __future__ import annotations

from datetime import timedelta
from hashlib import sha256
from typing import Any

from django.utils import timezone

from approvals import latency, sql
from approvals.errors import (
    ALREADY_APPROVED_BY_YOU,
    ALREADY_DECIDED,
    EXPIRED,
    FORBIDDEN,
    INVALID_STATE,
    REASON_REQUIRED,
    SELF_APPROVAL,
    STALE,
)
from approvals.event_types import APPROVAL_EVENTS
from approvals.models import Approval, ApprovalDecision
from approvals.policies import Requirement
from runs import events, outbox, transitions
from runs.errors import DomainError, not_found
from runs.models import User
from runs.services import actor_for_user

# The approvers' email (approvals/notifications.py), enqueued with the approval.
NOTIFY_TASK = "approvals.notify"


def approval_ids(approval: Approval) -> events.Ids:
    call = approval.tool_call
    return events.Ids(
        approval_id=approval.pk,
        tool_call_id=approval.tool_call_id,
        capability_id=call.capability_id,
        decision_id=call.decision_id or "",
    )


def approval_transition(
    approval: Approval, action: str, *, actor: str, producer: str, reason: str = "", **details
) -> None:
    """One approval transition: event and save in the caller's transaction (runs.transitions).
    A decision is counted in the latency counts in the same transaction."""
    event = transitions.apply(
        approval,
        action,
        field="state",
        event_type=APPROVAL_EVENTS[action],
        run=approval.run,
        actor=actor,
        producer=producer,
        ids=approval_ids(approval),
        reason=reason,
        refusal=INVALID_STATE,
        **details,
    )
    if event.event_type in latency.DECIDED:
        latency.latency_record(approval=approval, decided=event)


def summary_hash(summary: str, args_digest: str) -> str:
    """What an approver is shown, in one hash: the words and the exact arguments."""
    return sha256(f"{summary}\n{args_digest}".encode()).hexdigest()


def approval_open(
    *,
    call: Any,
    summary: str,
    permission: str,
    needed: Requirement,
    actor: str,
    producer: str,
    requested_by: User | None,
) -> Approval:
    """Ask people: bind an approval to this tool call's exact arguments, object revision,
    scope, policy version and expiry, and notify the tenant's approvers after commit."""
    approval = Approval.objects.create(
        tenant_id=call.tenant_id,
        run_id=call.run_id,
        tool_call=call,
        args=call.args,
        args_digest=call.args_digest,
        object_ref=call.object_ref,
        object_revision=call.object_revision,
        permission=permission,
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
    outbox.enqueue(NOTIFY_TASK, approval.pk)
    return approval


def approval_consume(*, approval: Approval, args_digest: str, actor: str) -> str:
    """Use an approved approval for the dispatch it authorizes: once. The caller holds the
    tool call's lock and the approval's, and read the approval under it (toolcalls:
    lock_latest_approval, one statement). Returns "consumed", "expired" or "changed" (the
    arguments are not the ones approved, or it is no longer approved)."""
    if approval.state != Approval.State.APPROVED or approval.args_digest != args_digest:
        return "changed"
    if approval.expires_at <= timezone.now():
        return "expired"
    approval_transition(approval, "consume", actor=actor, producer="dispatcher", reason="dispatch")
    return "consumed"


# --- people's decisions ---------------------------------------------------------------------


def _check_decider(approval: Approval, user: User) -> None:
    if user.tenant_id != approval.tenant_id:
        raise not_found("approval", approval.pk)
    if not user.can_decide:
        raise DomainError(FORBIDDEN, "Viewers cannot decide approvals.", status=403)
    if approval.requested_by_id == user.pk:
        raise DomainError(
            SELF_APPROVAL,
            "You asked for this action (the agent acts for you); someone else must decide.",
            status=403,
        )


def _check_fresh(approval: Approval, seen_version: int, seen_summary_hash: str) -> None:
    """Refuse a decision made on a page that no longer shows the truth, saying what changed."""
    if approval.state != Approval.State.PENDING:
        last = approval.decisions.select_related("user").last()
        who = f" by {last.user.username}" if last else ""
        raise DomainError(
            ALREADY_DECIDED, f"This approval is already {approval.state}{who}; nothing was changed."
        )
    if approval.expires_at <= timezone.now():
        raise DomainError(EXPIRED, "This approval has expired; it cannot be decided.")
    if seen_summary_hash != approval.summary_hash:
        raise DomainError(
            STALE,
            "What this approval would do changed since your page was rendered; review it again.",
        )
    if seen_version != approval.version:
        raise DomainError(
            STALE,
            f"This approval changed since your page was rendered ({approval.approvals_so_far} "
            f"of {approval.required_approvers} approvals now); review it again.",
        )


def approval_check_decision(
    *, approval: Approval, user: User, seen_version: int, seen_summary_hash: str
) -> None:
    """May this person decide this approval, on the page they saw? Raises the reason why not."""
    _check_decider(approval, user)
    _check_fresh(approval, seen_version, seen_summary_hash)


def approval_record_decision(
    *, approval: Approval, user: User, kind: str, reason: str = "", diff: dict | None = None
) -> None:
    """Store one person's decision with what they were shown, and its event. The approval's
    version is bumped in memory only: the caller's next write of it (a transition, or
    `approval_approve_if_quorum`'s save) stores it, in one UPDATE instead of two."""
    # One statement reads the decisions so far, which answer both "did you decide already?"
    # and the count of approvers, and inserts this one unless its person decided already
    # (the approve POST is on the approver's clock). When the transaction holds the run's lock
    # (the decisions lock it with the approval), it also answers whether another approval of
    # the run is pending, which the run's resume asks next (kept as `others_pending_in_run`),
    # and reads the run's chain head for the decision's events.
    run_held = events.batch_holds_run(approval.run_id)
    recorded = sql.record_decision(
        ApprovalDecision(
            approval=approval,
            user=user,
            decision=kind,
            reason=reason,
            summary_hash=approval.summary_hash,
            edit_diff=diff,
        ),
        run_id=approval.run_id if run_held else "",
    )
    if recorded is None:
        raise DomainError(
            ALREADY_APPROVED_BY_YOU,
            f"You approved already; it needs {approval.required_approvers} different people.",
        )
    # One decision per person (refused above), so counting decisions counts distinct people;
    # kept where `approvals_so_far` reads it, as the inbox's annotation is.
    approval.approved_count = sum(
        1
        for _, decided in [*recorded.earlier, (user.pk, kind)]
        if decided != ApprovalDecision.Kind.REJECT
    )
    approval.others_pending_in_run = recorded.others_pending
    if recorded.head is not None:  # read after the run's lock: the events need no read of it
        last_of_call = {approval.tool_call_id: recorded.head.last_of_call}
        events.batch_knows_head(approval.run_id, recorded.head.last, [], last_of_call)
    events.append(
        run=approval.run,
        event_type="approval.decision_recorded",
        payload={
            "user": user.username,
            "decision": kind,
            "reason": reason,
            "summary_hash": approval.summary_hash,
            **({"edit_diff": diff} if diff else {}),
            "approvals": approval.approvals_so_far,
            "required_approvers": approval.required_approvers,
        },
        producer="console",
        actor=actor_for_user(user),
        ids=approval_ids(approval),
    )
    approval.version += 1


def approval_approve(*, approval: Approval, user: User, reason: str = "") -> bool:
    """Record an approval by `user` (already checked); approve the approval once enough
    distinct people did. Returns whether it is now approved."""
    approval_record_decision(
        approval=approval, user=user, kind=ApprovalDecision.Kind.APPROVE, reason=reason
    )
    return approval_approve_if_quorum(approval=approval, actor=actor_for_user(user))


def approval_approve_if_quorum(*, approval: Approval, actor: str) -> bool:
    """After `approval_record_decision`: approved once enough people approved; otherwise the
    decision's version is saved and it waits for more."""
    if approval.approvals_so_far < approval.required_approvers:
        approval.save(update_fields=["version", "updated_at"])
        return False
    approval_transition(
        approval, "approve", actor=actor, producer="console", reason="quorum reached"
    )
    return True


def approval_reject(*, approval: Approval, user: User, reason: str) -> None:
    if not reason.strip():
        raise DomainError(REASON_REQUIRED, "Say why you reject it.", status=422)
    approval_record_decision(
        approval=approval, user=user, kind=ApprovalDecision.Kind.REJECT, reason=reason
    )
    approval_transition(
        approval, "reject", actor=actor_for_user(user), producer="console", reason=reason
    )


def approval_record_edit(*, approval: Approval, user: User, reason: str, diff: dict) -> None:
    """The person approved other arguments: their decision is kept on this approval, which no
    longer describes the call (toolcalls opens a new one for the new arguments if needed)."""
    approval_record_decision(
        approval=approval,
        user=user,
        kind=ApprovalDecision.Kind.APPROVE_WITH_EDITS,
        reason=reason,
        diff=diff,
    )
    approval_transition(
        approval,
        "invalidate",
        actor=actor_for_user(user),
        producer="console",
        reason=f"arguments edited by {user.username}",
    )
