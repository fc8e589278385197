"""Proposing a tool call: validate it, fix its idempotency key, record it, and either hold it
for approval or authorize it (DESIGN sections 5, 6 and 8)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import Policy
from approvals.policies import Requirement, policy_preview, requirement
from runs import dbvalues, events, logcontext, transitions
from runs.canonical import digest
from runs.errors import (
    AUTH_SCOPE_MISSING,
    IDEMPOTENCY_CONFLICT,
    RUN_CLOSED,
    DomainError,
    not_found,
)
from runs.ids import new_id
from runs.models import ApiKey, Decision, OutboxMessage, Run, Tenant, User
from runs.selectors import run_get
from toolcalls import capabilities, errors, gate, sql, sql_propose
from toolcalls.capabilities import Capability
from toolcalls.capabilities.base import OpenCall
from toolcalls.checks import business_check, invalid
from toolcalls.models import ObjectRevision, ToolCall
from toolcalls.selectors import proposed_args_digest
from toolcalls.writes import bind_log_ids, tool_call_event, tool_call_transition


def idempotency_key(tenant: Tenant, capability: Capability, object_ref: str, intent: str) -> str:
    return f"{tenant.slug}:{object_ref}:{capability.action}:{intent}"


def tool_call_propose(
    *,
    tenant: Tenant,
    run_id: str,
    capability_id: str,
    args: Any,
    intent: str,
    actor: str,
    object_ref: str = "",
    object_revision: int | None = None,
    decision_id: str | None = None,
    requested_by: User | None = None,
    depends_on: list[str] | None = None,
    api_key: ApiKey | None = None,
) -> tuple[ToolCall, bool]:
    """Validate and record a proposed call. Returns (call, created); the same key with the
    same arguments returns the existing call, with other arguments it is a conflict.
    `api_key` is the agent's key (the API passes it): its scopes must cover the capability.
    Without one the caller is trusted code (a test, the benchmark), not an agent."""
    try:
        capability = _capability(capability_id)
        if api_key is not None:
            check_scope(api_key, capability)
        derived_ref = _object_ref(capability, args, object_ref)
    except DomainError:
        run_get(tenant=tenant, run_id=run_id)  # another tenant's run is a 404 before anything else
        raise
    key = idempotency_key(tenant, capability, derived_ref, intent)
    args_digest = digest(args)
    found = _lookup(tenant, run_id, key, capability, derived_ref)
    if found.existing_call_id:
        existing = ToolCall.objects.get(pk=found.existing_call_id)
        return _same_call(existing, args_digest), False
    _business_check(tenant, capability, args, derived_ref, found)
    try:
        # One chain-head read and one INSERT for the proposal's events (runs/events.py).
        with transaction.atomic(), events.batch():
            run = _lock_open_run(tenant, run_id)
            call = tool_call_create(
                run=run,
                capability=capability,
                args=args,
                args_digest=args_digest,
                key=key,
                intent=intent,
                object_ref=derived_ref,
                object_revision=object_revision,
                decision=_decision(run, decision_id),
                actor=actor,
                requested_by=requested_by,
                dependencies=_dependencies(run, depends_on or []),
            )
    except IntegrityError:
        # A concurrent proposal with the same key committed first.
        existing = ToolCall.objects.get(tenant=tenant, idempotency_key=key)
        return _same_call(existing, args_digest), False
    return call, True


def tool_call_evaluate_policy(
    *, tenant: Tenant, capability_id: str, args: Any, policy: Policy | None = None
) -> dict:
    """A dry run of the policy for a proposal of these arguments now: would people have to
    approve it, by which rule, how many, and until when. It writes nothing (not even the
    default policy a first proposal writes) and reads no external system: the business check
    runs only when the call is proposed. `policy` is an unsaved draft to judge by instead of
    the current version (the console's "try this rule"), so both answer with this code."""
    capability = _capability(capability_id)
    problems = capability.validate(args)
    if problems:
        raise invalid(problems)
    policy = policy or policy_preview(tenant, capability.id)
    needed = requirement(policy, args, capability.risk)
    asks = needed.approvers > 0
    return {
        "capability": capability.id,
        "needs_approval": asks,
        "rule": needed.rule_name if asks else None,
        "required_approvers": needed.approvers,
        "risk": needed.risk,
        "policy_version": policy.version,
        "expiry_seconds": policy.expiry_seconds if asks else None,
        "expires_at": timezone.now() + timedelta(seconds=policy.expiry_seconds) if asks else None,
        "on_expiry": policy.on_expiry if asks else None,
        "summary": capability.summary(args),
    }


def _lookup(
    tenant: Tenant, run_id: str, key: str, capability: Capability, object_ref: str
) -> sql.ProposalLookup:
    """The run, the call holding the key and our open calls on the object: one statement."""
    found = sql.proposal_lookup(
        tenant_id=tenant.pk,
        run_id=run_id,
        key=key,
        capability_id=capability.id,
        object_ref=object_ref,
    )
    if found is None:
        raise not_found("run", run_id)
    logcontext.bind(run_id=found.run_id, correlation_id=found.correlation_id)
    return found


def _business_check(
    tenant: Tenant, capability: Capability, args: Any, object_ref: str, found: sql.ProposalLookup
) -> None:
    """The contract's check, given the open calls on the object that the lookup read."""
    open_calls = [OpenCall(*call) for call in found.open_calls]
    problems = business_check(
        tenant, capability, args, known_open_calls=(capability.id, object_ref, open_calls)
    )
    if problems:
        raise invalid(problems)


def _object_ref(capability: Capability, args: Any, object_ref: str) -> str:
    """The object the arguments act on, once they pass the contract's schema; an `object_ref`
    the agent gave must name the same."""
    problems = capability.validate(args)
    if problems:
        raise invalid(problems)
    derived_ref = capability.object_ref(args)
    if object_ref and object_ref != derived_ref:
        raise invalid([{"field": "object.ref", "problem": f"these args act on {derived_ref!r}"}])
    return derived_ref


def _capability(capability_id: str) -> Capability:
    capability = capabilities.get(capability_id)
    if capability is None:
        raise DomainError(
            errors.VALIDATION_FAILED,
            f"No capability {capability_id!r}; GET /api/v1/capabilities lists them.",
            status=422,
            details=[{"field": "capability", "problem": "unknown capability"}],
        )
    return capability


def check_scope(api_key: ApiKey, capability: Capability) -> None:
    """403 `auth.scope_missing` unless the key may propose `capability`. Checked before
    anything is read or written for the call: a key may not even learn whether the same
    proposal exists already."""
    if api_key.may_propose(capability_id=capability.id, permission=capability.permission):
        return
    group = capability.permission.split(".")[0]
    raise DomainError(
        AUTH_SCOPE_MISSING,
        f"This API key may not propose {capability.id}: that needs the scope "
        f"{capability.permission!r} (or {group + '.*'!r}, {capability.id!r} or '*'), and the "
        f"key has {', '.join(api_key.scopes) or 'no scopes'}. Ask an admin for a key with it.",
        status=403,
        details=[{"field": "capability", "problem": f"needs scope {capability.permission}"}],
    )


def _same_call(existing: ToolCall, args_digest: str) -> ToolCall:
    # After an approver's edit the agent may send what it proposed again (a framework
    # replaying its node): that is still this call, answered as edited (`executed_args`).
    if existing.args_digest != args_digest and args_digest != proposed_args_digest(call=existing):
        raise DomainError(
            IDEMPOTENCY_CONFLICT,
            f"Tool call {existing.pk} already has this intent on this object with other "
            "arguments; a new intent needs a new `intent` value.",
        )
    return existing


def _lock_open_run(tenant: Tenant, run_id: str) -> Run:
    run = sql.lock_run(tenant_id=tenant.pk, run_id=run_id)
    if run is None:
        raise not_found("run", run_id)
    if not run.is_open:
        raise DomainError(RUN_CLOSED, f"Run {run.pk} is {run.state}; it takes no new calls.")
    run.tenant = tenant  # known already: the policy check reads it without another query
    return run


def _decision(run: Run, decision_id: str | None) -> Decision | None:
    if not decision_id:
        return None
    decision = Decision.objects.filter(run=run, pk=decision_id).first()
    if decision is None:
        raise invalid([{"field": "decision_id", "problem": "not a decision of this run"}])
    return decision


def _dependencies(run: Run, ids: list[str]) -> list[ToolCall]:
    if not ids:
        return []
    found = list(ToolCall.objects.filter(run=run, pk__in=ids))
    missing = sorted(set(ids) - {call.pk for call in found})
    if missing:
        raise invalid(
            [{"field": "depends_on", "problem": f"not calls of this run: {', '.join(missing)}"}]
        )
    return found


WRITE_CAPABILITIES = [c.id for c in capabilities.REGISTRY.values() if c.kind == "write"]


def _check_object(run: Run, capability: Capability, object_ref: str, revision: int) -> None:
    """The revision the call was computed from must be current, and one writer at a time may
    hold it: a second open write on the same object revision is a precondition.conflict."""
    ObjectRevision.objects.get_or_create(
        tenant_id=run.tenant_id, ref=object_ref, defaults={"revision": revision}
    )
    current = ObjectRevision.objects.select_for_update().get(
        tenant_id=run.tenant_id, ref=object_ref
    )
    if current.revision != revision:
        raise DomainError(
            errors.PRECONDITION_CONFLICT,
            f"{object_ref} is at revision {current.revision}, not {revision}: "
            "compute the call again from the current object.",
        )
    if capability.kind != "write":
        return
    writer = (
        ToolCall.objects.filter(
            tenant_id=run.tenant_id,
            object_ref=object_ref,
            object_revision=revision,
            capability_id__in=WRITE_CAPABILITIES,
        )
        .exclude(execution_status__in=ToolCall.FINAL_EXECUTION)
        .first()
    )
    if writer is not None:
        raise DomainError(
            errors.PRECONDITION_CONFLICT,
            f"{writer.pk} already writes {object_ref} at revision {revision}; wait for it and "
            "compute the next call from the revision it leaves.",
        )


def _proposed_payload(
    call: ToolCall, capability: Capability, dependencies: list[ToolCall]
) -> dict[str, Any]:
    return {
        "capability": capability.id,
        "capability_version": capability.version,
        "args": call.args,
        "args_digest": call.args_digest,
        "idempotency_key": call.idempotency_key,
        "external_request_id": call.external_request_id,
        "intent": call.intent,
        "object_ref": call.object_ref,
        "object_revision": call.object_revision,
        "compensation_of": call.compensation_of_id,
        "depends_on": [dependency.pk for dependency in dependencies],
        "summary": capability.summary(call.args),
    }


def tool_call_create(
    *,
    run: Run,
    capability: Capability,
    args: dict,
    args_digest: str,
    key: str,
    intent: str,
    object_ref: str,
    object_revision: int | None,
    decision: Decision | None,
    actor: str,
    requested_by: User | None = None,
    compensation_of: ToolCall | None = None,
    dependencies: list[ToolCall] | None = None,
) -> ToolCall:
    """Record a checked call with its `tool_call.proposed` event, then let the policy decide:
    held for approval, or authorized and dispatched. The run is locked."""
    # ToolCall(**values) less Model.__init__'s generic loop (runs/dbvalues.py).
    call = dbvalues.new(
        ToolCall,
        {
            "tenant": run.tenant,
            "run": run,
            "capability_id": capability.id,
            "decision": decision,
            "intent": intent,
            "object_ref": object_ref,
            "object_revision": object_revision,
            "args": args,
            "args_digest": args_digest,
            "idempotency_key": key,
            "external_request_id": new_id("req"),
            "compensation_of": compensation_of,
        },
    )
    tally = _tally(run, call, capability)
    needed = gate.requirement_for(call, capability, tally.newest_policy_id)
    bind_log_ids(call)
    _write_decided(call, capability, needed, actor, dependencies or [])
    if dependencies:
        call.depends_on.set(dependencies)
    if needed.approvers:
        gate.tool_call_hold_for_approval(
            call=call,
            capability=capability,
            needed=needed,
            actor=actor,
            producer="api",
            reason=_held_because(needed),
            requested_by=requested_by,
        )
    return call


def _write_decided(
    call: ToolCall,
    capability: Capability,
    needed: Requirement,
    actor: str,
    dependencies: list[ToolCall],
) -> None:
    """The call's `tool_call.proposed` event and its policy's transition, then the call written
    once, as that transition leaves it (sql_propose.py): the transitions append their events,
    in order, and do not save it."""
    created_at = timezone.now()  # before its events, as when the call was inserted first
    with transitions.saved_once(call):
        payload = _proposed_payload(call, capability, dependencies)
        tool_call_event(call, "tool_call.proposed", payload, actor=actor, producer="api")
        message = _decide(call, needed, actor)
        sql_propose.insert_decided(call, created_at=created_at, message=message)
    sql_propose.call_written(call)


def _tally(run: Run, call: ToolCall, capability: Capability) -> sql_propose.RunTally:
    """Within the run's budget, and the object's revision current: the run's tally. The
    events of this block take the chain head it read."""
    tally = sql_propose.run_tally(
        run_id=run.pk, tenant_id=run.tenant_id, capability_id=capability.id
    )
    if tally.calls >= run.max_tool_calls:
        raise DomainError(
            errors.MAX_STEPS_EXCEEDED,
            f"Run {run.pk} has used its {run.max_tool_calls} tool calls.",
        )
    if call.object_revision is not None:
        _check_object(run, capability, call.object_ref, call.object_revision)
    if tally.head_read:
        events.batch_knows_head(run.pk, tally.head, [call.pk])
    return tally


def _decide(call: ToolCall, needed: Requirement, actor: str) -> OutboxMessage | None:
    """The policy's transition: held for people (the approval is opened once the call is
    written), or authorized, with its dispatch message for the call's INSERT to write."""
    if needed.approvers:
        tool_call_transition(
            call, "request_approval", actor=actor, producer="api", reason=_held_because(needed)
        )
        return None
    return gate.tool_call_authorize(
        call=call,
        actor=actor,
        producer="api",
        reason=f"policy v{needed.policy.version} asks no approver",
        write_message=False,
    )


def _held_because(needed: Requirement) -> str:
    return f"policy v{needed.policy.version}: {needed.rule_name}"
