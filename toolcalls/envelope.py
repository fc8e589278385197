"""The result envelope: what every API answer about a tool call says, and what its webhooks
carry (docs/agent-api.md, "The result envelope").

Beside the call's own fields it answers an agent's questions in one place: `status` (one word
to act on, `ToolCall.agent_status`), `result` (the receipt's business fields), what actually
runs (`executed_args`, `edited`), who decided and why (`decision`, usernames only), where a
person decides (`approval_url`), until when (`expires_at`), and when to ask again
(`retry_after_s`).
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval, ApprovalDecision
from toolcalls import sql
from toolcalls.models import AgentStatus, E, ToolCall

# Fields of a receipt that are our own plumbing, echoed back by the system, not its business
# answer: the call carries them already (`idempotency_key`, `external_request_id`).
PLUMBING_FIELDS = frozenset({"idempotency_key", "request_id", "external_request_id"})

# Seconds a poller should wait before asking again, by status (null: it will not change by
# itself). People take minutes; `?wait=` answers as soon as anything changes anyway.
RETRY_AFTER_SECONDS = {
    AgentStatus.AWAITING_APPROVAL: 5,
    AgentStatus.RUNNING: 1,
    AgentStatus.UNKNOWN: 5,
}
# An unknown outcome a person owns (needs_human, inconclusive) moves at a person's pace.
RETRY_AFTER_PERSON_SECONDS = 30

OUTCOME_BY_STATE = {
    Approval.State.APPROVED: "approved",
    Approval.State.CONSUMED: "approved",
    Approval.State.REJECTED: "rejected",
    Approval.State.PENDING: "pending",
}


def business_result(result: Any) -> Any:
    if not isinstance(result, dict):
        return result
    return {key: value for key, value in result.items() if key not in PLUMBING_FIELDS}


def approval_url(approval: Approval) -> str:
    path = reverse("approvals:detail", args=[approval.pk])
    return settings.COUNTERSIGN_BASE_URL.rstrip("/") + path


def retry_after(call: ToolCall, status: str) -> int | None:
    if call.execution_status == "needs_human" or call.verification_status == "inconclusive":
        return RETRY_AFTER_PERSON_SECONDS
    seconds = RETRY_AFTER_SECONDS.get(status)
    if seconds is not None and call.next_attempt_at:
        # A retry (or a breaker) holds it until then: asking sooner shows nothing new.
        waiting = (call.next_attempt_at - timezone.now()).total_seconds()
        seconds = max(seconds, math.ceil(waiting))
    return seconds


def approval_out(approval: Approval | None, decisions: list[ApprovalDecision]) -> dict | None:
    if approval is None:
        return None
    return {
        "approval_id": approval.pk,
        "state": approval.state,
        "required_approvers": approval.required_approvers,
        "approvals": sum(1 for d in decisions if d.decision != ApprovalDecision.Kind.REJECT),
        "rule": approval.rule_name,
        "policy_version": approval.policy_version,
        "expires_at": approval.expires_at,
    }


def decision_out(approval: Approval, decisions: list[ApprovalDecision]) -> dict[str, Any]:
    """What people decided on `approval`: the outcome, who (usernames, never addresses) and
    why. An approver's edit ends the approval it was made on (`invalidated`) and stands as an
    approval of the new arguments when they need nobody else."""
    edited = any(d.decision == ApprovalDecision.Kind.APPROVE_WITH_EDITS for d in decisions)
    outcome = OUTCOME_BY_STATE.get(approval.state, approval.state)
    if approval.state == Approval.State.INVALIDATED and edited:
        outcome = "approved"
    reasons = [d.reason for d in decisions if d.reason]
    return {
        "outcome": outcome,
        "by": [d.user.username for d in decisions],
        "reason": reasons[-1] if reasons else "",
        "decided_at": decisions[-1].created_at,
        "decisions": [
            {
                "user": d.user.username,
                "decision": d.decision,
                "reason": d.reason,
                "changes": d.edit_diff,
                "at": d.created_at,
            }
            for d in decisions
        ],
    }


def _approvals_with_decisions(
    call: ToolCall, relations: sql.Relations
) -> list[tuple[Approval, list[ApprovalDecision]]]:
    """The call's approvals, newest first, each with its decisions (two queries, none when
    it has no approval)."""
    if not relations.has_approvals:
        return []
    approvals = list(call.approvals.order_by("-created_at"))
    if not approvals:
        return []
    decisions: dict[str, list[ApprovalDecision]] = {a.pk: [] for a in approvals}
    for decision in (
        ApprovalDecision.objects.filter(approval__in=approvals)
        .select_related("user")
        .order_by("created_at", "id")
    ):
        decisions[decision.approval_id].append(decision)
    return [(approval, decisions[approval.pk]) for approval in approvals]


def new_call_relations(call: ToolCall, depends_on: list[str]) -> sql.Relations:
    """`sql.call_relations` of a call this request has just proposed, without reading them:
    no attempt and no compensation yet, the dependencies it was given (all found, or the
    proposal was refused), approvals when the policy held it. A worker that claims the call
    meanwhile changes a row this answer does not show either: it describes the call as the
    proposal left it. The statement was a twelfth of the request (profile_propose --via api)."""
    held = call.execution_status == E.AWAITING_APPROVAL
    return sql.Relations(0, None, sorted(set(depends_on)), held)


def tool_call_out(call: ToolCall, relations: sql.Relations | None = None) -> dict[str, Any]:
    """Every API answer about a tool call, and the `tool_call` of its webhooks. `relations`:
    when the caller knows them (`new_call_relations`), they are not read."""
    if relations is None:
        relations = sql.call_relations(call) if call.pk else sql.NO_RELATIONS
    approvals = _approvals_with_decisions(call, relations)
    latest, latest_decisions = approvals[0] if approvals else (None, [])
    decided = next(((a, d) for a, d in approvals if d), None)
    edited = any(d.edit_diff for _, ds in approvals for d in ds)
    status = call.agent_status
    return {
        "tool_call_id": call.pk,
        "run_id": call.run_id,
        "capability": call.capability_id,
        "status": status,
        "result": business_result(call.result),
        "executed_args": call.args,
        "edited": edited,
        "decision": decision_out(*decided) if decided else None,
        "approval_url": approval_url(latest) if latest else None,
        "expires_at": latest.expires_at if latest and latest.is_open else None,
        "retry_after_s": retry_after(call, status),
        "args": call.args,
        "args_digest": call.args_digest,
        "intent": call.intent,
        "object": {"ref": call.object_ref, "revision": call.object_revision},
        "decision_id": call.decision_id,
        "idempotency_key": call.idempotency_key,
        "external_request_id": call.external_request_id,
        "execution_status": call.execution_status,
        "verification_status": call.verification_status,
        "approval": approval_out(latest, latest_decisions),
        "external_id": call.external_id,
        "raw_result": call.result,
        "last_error": (
            {"name": call.last_error_name, "message": call.last_error_message}
            if call.last_error_name
            else None
        ),
        "attempts": relations.attempts,
        "fencing_token": call.fencing_token,
        "depends_on": relations.depends_on,
        "compensation_of": call.compensation_of_id,
        "compensation": relations.compensation_id,
        "created_at": call.created_at,
        "updated_at": call.updated_at,
    }
