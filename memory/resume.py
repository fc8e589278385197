"""The resume contract (seed 000, pattern 4): everything a fresh agent needs to continue a
run safely, computed from stored state on every request.

A checkpoint says where the agent was; it does not say what happened to the world since.
So beside the latest checkpoints the contract gives the progress contract, the receipts of
what the external systems confirmed, the calls whose outcome is unknown (never to be sent
again by the agent), the approvals people still have to decide, and what the runtime will
check again before anything is sent.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse

from approvals.models import Approval, Policy
from approvals.policies import requirement
from memory.archive import refuse_if_archived
from memory.checkpoints import checkpoint_out, checkpoints_latest
from runs.errors import DomainError
from runs.models import ApiKey, Run
from toolcalls import capabilities
from toolcalls.models import E, ObjectRevision, ToolCall
from toolcalls.progress import progress
from toolcalls.selectors import run_tool_calls

RULES = [
    "Never send again a call listed in unknown_calls: the runtime looks each one up at the "
    "external system by its external request id, and sends it again (with the same "
    "idempotency key) only once a look-up proves it never happened.",
    "Proposing the same intent with the same arguments returns the same call; it never starts "
    "a second operation. Use the tool_call_ids of your checkpoint to find your calls.",
    "Do not propose again a call waiting for approval: a person decides it at approval_url.",
    "Receipts are what the external systems confirmed: treat those operations as done.",
    "Before any call is sent, the runtime checks again everything in revalidated_on_resume: "
    "the approval (approved, not used, same arguments, not expired), the object's revision, "
    "the current policy, the run's budgets and deadline, and the capability's circuit breaker.",
]


def resume_contract(*, run: Run, api_key: ApiKey) -> dict[str, Any]:
    refuse_if_archived(run)
    calls = list(run_tool_calls(run=run))
    approvals = list(
        Approval.objects.filter(run=run).select_related("policy").order_by("created_at")
    )
    return {
        "run": {
            "run_id": run.pk,
            "title": run.title,
            "state": run.state,
            "is_open": run.is_open,
            "correlation_id": run.correlation_id,
        },
        "checkpoints": [_checkpoint(c) for c in checkpoints_latest(run=run)],
        "progress": progress(run, calls),
        "receipts": _receipts(calls),
        "unknown_calls": [_unknown(call) for call in calls if call.is_unknown],
        "pending_approvals": [_pending(a) for a in approvals if a.is_pending],
        "revalidated_on_resume": _revalidated(run, calls, approvals, api_key),
        "rules": RULES,
    }


def _checkpoint(checkpoint: Any) -> dict[str, Any]:
    """The latest version, migrated; one that cannot be migrated says why instead of failing
    the whole contract."""
    try:
        return checkpoint_out(checkpoint)
    except DomainError as exc:
        return {
            "checkpoint_id": checkpoint.pk,
            "name": checkpoint.name,
            "kind": checkpoint.kind,
            "version": checkpoint.version,
            "written_schema_version": checkpoint.schema_version,
            "error": {"name": exc.name, "message": exc.message},
        }


def _receipts(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "receipt_id": receipt.pk,
            "tool_call_id": call.pk,
            "capability": call.capability_id,
            "execution_status": call.execution_status,
            "verification_status": call.verification_status,
            "external_id": receipt.external_id,
            "status": receipt.status,
            "source": receipt.source,
            "raw_response": receipt.raw_response,
            "created_at": receipt.created_at,
        }
        for call in calls
        for receipt in call.receipts.all()
    ]


def _unknown(call: ToolCall) -> dict[str, Any]:
    if call.execution_status == E.NEEDS_HUMAN:
        who = "A person resolves it on the unknowns desk, with evidence from the system."
    else:
        who = "The runtime is looking it up at the external system; wait for its outcome."
    return {
        "tool_call_id": call.pk,
        "capability": call.capability_id,
        "execution_status": call.execution_status,
        "idempotency_key": call.idempotency_key,
        "external_request_id": call.external_request_id,
        "last_error": call.last_error_name,
        "lookups": call.lookups,
        "since": call.updated_at,
        "agent_may_retry": False,
        "what_happens": f"It may have happened: do not send it again. {who}",
    }


def approval_url(approval: Approval) -> str:
    return settings.COUNTERSIGN_BASE_URL.rstrip("/") + reverse(
        "approvals:detail", args=[approval.pk]
    )


def _pending(approval: Approval) -> dict[str, Any]:
    return {
        "approval_id": approval.pk,
        "tool_call_id": approval.tool_call_id,
        "approval_url": approval_url(approval),
        "summary": approval.summary,
        "risk": approval.risk,
        "rule": approval.rule_name,
        "policy_version": approval.policy_version,
        "required_approvers": approval.required_approvers,
        "approvals_so_far": approval.approvals_so_far,
        "expires_at": approval.expires_at,
    }


def _revalidated(
    run: Run, calls: list[ToolCall], approvals: list[Approval], api_key: ApiKey
) -> dict[str, Any]:
    """For every call that may still be sent (not yet sent, or unknown and possibly sent
    again after a look-up): what the runtime checks again, as it stands now."""
    latest_approval = {a.tool_call_id: a for a in approvals}  # ordered: the newest wins
    pending = [c for c in calls if c.execution_status in (*ToolCall.NOT_SENT, *ToolCall.UNKNOWN)]
    policies: dict[str, Policy | None] = {}
    revisions = dict(
        ObjectRevision.objects.filter(
            tenant_id=run.tenant_id, ref__in={c.object_ref for c in pending if c.object_ref}
        ).values_list("ref", "revision")
    )
    checks = []
    for call in pending:
        if call.capability_id not in policies:
            policies[call.capability_id] = (
                Policy.objects.filter(tenant_id=run.tenant_id, capability_id=call.capability_id)
                .order_by("-version")
                .first()
            )
        checks.append(
            _call_checks(
                call, latest_approval.get(call.pk), policies[call.capability_id], revisions
            )
        )
    return {
        "tool_calls": checks,
        "api_key": {
            "api_key_id": api_key.pk,
            "active": api_key.is_active,
            "permissions_needed": sorted({c["permission"] for c in checks if c["permission"]}),
            "scopes": list(api_key.scopes),
            "note": "Proposing, retrying or compensating a call needs a scope of this key that "
            "covers its permission (403 auth.scope_missing otherwise).",
        },
    }


def _call_checks(
    call: ToolCall, approval: Approval | None, policy: Policy | None, revisions: dict[str, int]
) -> dict[str, Any]:
    capability = capabilities.get(call.capability_id)
    needed_now = (
        requirement(policy, call.args, capability.risk).approvers if policy and capability else 0
    )
    revision_now = revisions.get(call.object_ref)
    return {
        "tool_call_id": call.pk,
        "capability": call.capability_id,
        "execution_status": call.execution_status,
        "permission": capability.permission if capability else "",
        "policy": {
            "version_at_approval": approval.policy_version if approval else None,
            "version_now": policy.version if policy else None,
            "approvers_at_approval": approval.required_approvers if approval else None,
            "approvers_needed_now": needed_now,
            "changed": bool(approval and policy and approval.policy_version != policy.version),
        },
        "approval": (
            {
                "approval_id": approval.pk,
                "state": approval.state,
                "args_digest_matches": approval.args_digest == call.args_digest,
            }
            if approval
            else None
        ),
        "object": (
            {
                "ref": call.object_ref,
                "revision_at_proposal": call.object_revision,
                "revision_now": revision_now,
                "changed": revision_now is not None and revision_now != call.object_revision,
            }
            if call.object_revision is not None
            else None
        ),
    }
