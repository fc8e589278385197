"""Tool call writes: propose, dispatch, reconcile, verify, compensate, retry, stop, sweep.

Every state change locks the call, applies a transition, appends its event and saves in one
transaction, and enqueues follow-up work through the outbox in that same transaction. The
external system is called between two transactions, never inside one: a claim (fencing token,
lease, `dispatching`) commits first, the outcome is recorded after, and only if the token is
still current.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from approvals import gate
from runs import events, outbox, transitions
from runs.canonical import digest
from runs.errors import DomainError, not_found
from runs.faults import crashpoint
from runs.ids import new_id
from runs.models import Decision, Run, Tenant, User
from runs.selectors import run_get
from runs.services import run_transition
from toolcalls import breaker, capabilities, connectors
from toolcalls.capabilities import Capability, TrustedData, UpstreamUnavailable
from toolcalls.event_types import EXECUTION_EVENTS, VERIFICATION_EVENTS
from toolcalls.models import Attempt, E, ObjectRevision, Receipt, ToolCall, V

log = logging.getLogger(__name__)

DISPATCH_TASK = "toolcalls.dispatch"
RECONCILE_TASK = "toolcalls.reconcile"
VERIFY_TASK = "toolcalls.verify"
MAX_VERIFICATIONS = 6
# Errors that prove the operation was not executed: a person may send it again.
NOT_EXECUTED_ERRORS = {
    "tool.rate_limited",
    "tool.upstream_5xx",
    "tool.unreachable",
    "flow.budget_exceeded",
    "flow.deadline_exceeded",
    "tool.did_not_happen",
}


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def call_ids(call: ToolCall) -> events.Ids:
    return events.Ids(
        tool_call_id=call.pk, capability_id=call.capability_id, decision_id=call.decision_id or ""
    )


def log_call_event(
    call: ToolCall, event_type: str, payload: dict[str, Any], *, actor: str, producer: str
):
    return events.append(
        run=call.run,
        event_type=event_type,
        payload=payload,
        producer=producer,
        actor=actor,
        ids=call_ids(call),
    )


def call_transition(
    call: ToolCall, action: str, *, actor: str, producer: str, reason: str = "", **details: Any
) -> None:
    """Apply one transition of either machine and log it; the caller saves the call."""
    verification = action in VERIFICATION_EVENTS
    transitions.apply(
        call,
        action,
        field="verification_status" if verification else "execution_status",
        event_type=VERIFICATION_EVENTS[action] if verification else EXECUTION_EVENTS[action],
        run=call.run,
        actor=actor,
        producer=producer,
        ids=call_ids(call),
        reason=reason,
        refusal="tool_call.invalid_state",
        **details,
    )


def lock_call(tool_call_id: str) -> ToolCall | None:
    return (
        ToolCall.objects.select_for_update(of=("self",))
        .select_related("run", "tenant")
        .filter(pk=tool_call_id)
        .first()
    )


def _lock_for_tenant(tenant: Tenant, tool_call_id: str) -> ToolCall:
    call = lock_call(tool_call_id)
    if call is None or call.tenant_id != tenant.pk:
        raise not_found("tool call", tool_call_id)
    return call


def _capability(call: ToolCall) -> Capability:
    capability = capabilities.get(call.capability_id)
    if capability is None:
        # A contract removed from code while calls still use it: keep them readable, stop work.
        raise DomainError("capability.unknown", f"{call.capability_id} is no longer registered.")
    return capability


def _timeout(capability: Capability) -> float:
    return settings.TOOLCALL_TIMEOUT_OVERRIDE or capability.timeout


# --- propose --------------------------------------------------------------------------------


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
) -> tuple[ToolCall, bool]:
    """Validate and record a proposed call. Returns (call, created); the same key with the
    same arguments returns the existing call, with other arguments it is a conflict."""
    run_get(tenant=tenant, run_id=run_id)  # another tenant's run is a 404 before anything else
    capability = capabilities.get(capability_id)
    if capability is None:
        raise DomainError(
            "tool.validation_failed",
            f"No capability {capability_id!r}; GET /api/v1/capabilities lists them.",
            status=422,
            details=[{"field": "capability", "problem": "unknown capability"}],
        )
    problems = capability.validate(args)
    if problems:
        raise _invalid(problems)
    derived_ref = capability.object_ref(args)
    if object_ref and object_ref != derived_ref:
        raise _invalid([{"field": "object.ref", "problem": f"these args act on {derived_ref!r}"}])
    key = idempotency_key(tenant, capability, derived_ref, intent)
    args_digest = digest(args)
    existing = ToolCall.objects.filter(tenant=tenant, idempotency_key=key).first()
    if existing:
        return _same_call(existing, args_digest), False
    problems = business_check(tenant, capability, args)
    if problems:
        raise _invalid(problems)
    try:
        with transaction.atomic():
            run = _lock_open_run(tenant, run_id)
            decision = _decision(run, decision_id)
            dependencies = _dependencies(run, depends_on or [])
            call = _create_call(
                run=run,
                capability=capability,
                args=args,
                args_digest=args_digest,
                key=key,
                intent=intent,
                object_ref=derived_ref,
                object_revision=object_revision,
                decision=decision,
                actor=actor,
                requested_by=requested_by,
                dependencies=dependencies,
            )
    except IntegrityError:
        # A concurrent proposal with the same key committed first.
        existing = ToolCall.objects.get(tenant=tenant, idempotency_key=key)
        return _same_call(existing, args_digest), False
    return call, True


def _invalid(problems: list[dict[str, str]]) -> DomainError:
    fields = ", ".join(p["field"] for p in problems)
    return DomainError(
        "tool.validation_failed", f"Fix these fields: {fields}.", status=422, details=problems
    )


def business_check(tenant: Tenant, capability: Capability, args: dict) -> list[dict]:
    try:
        return capability.business_check(TrustedData(tenant.slug), args)
    except UpstreamUnavailable as exc:
        raise DomainError(
            "tool.check_unavailable",
            f"Could not check the request against {capability.system}: {exc}. Try again.",
            status=503,
        ) from exc


def _same_call(existing: ToolCall, args_digest: str) -> ToolCall:
    if existing.args_digest != args_digest:
        raise DomainError(
            "idempotency.conflict",
            f"Tool call {existing.pk} already has this intent on this object with other "
            "arguments; a new intent needs a new `intent` value.",
        )
    return existing


def _lock_open_run(tenant: Tenant, run_id: str) -> Run:
    run = Run.objects.select_for_update().filter(tenant=tenant, pk=run_id).first()
    if run is None:
        raise not_found("run", run_id)
    if not run.is_open:
        raise DomainError("run.closed", f"Run {run.pk} is {run.state}; it takes no new calls.")
    run.tenant = tenant  # known already: the policy check reads it without another query
    return run


def _decision(run: Run, decision_id: str | None) -> Decision | None:
    if not decision_id:
        return None
    decision = Decision.objects.filter(run=run, pk=decision_id).first()
    if decision is None:
        raise _invalid([{"field": "decision_id", "problem": "not a decision of this run"}])
    return decision


def _dependencies(run: Run, ids: list[str]) -> list[ToolCall]:
    if not ids:
        return []
    found = list(ToolCall.objects.filter(run=run, pk__in=ids))
    missing = sorted(set(ids) - {call.pk for call in found})
    if missing:
        raise _invalid(
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
            "precondition.conflict",
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
            "precondition.conflict",
            f"{writer.pk} already writes {object_ref} at revision {revision}; wait for it and "
            "compute the next call from the revision it leaves.",
        )


def _create_call(
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
    if run.tool_calls.count() >= run.max_tool_calls:
        raise DomainError(
            "flow.max_steps_exceeded",
            f"Run {run.pk} has used its {run.max_tool_calls} tool calls.",
        )
    if object_revision is not None:
        _check_object(run, capability, object_ref, object_revision)
    call = ToolCall(
        tenant=run.tenant,
        run=run,
        capability_id=capability.id,
        decision=decision,
        intent=intent,
        object_ref=object_ref,
        object_revision=object_revision,
        args=args,
        args_digest=args_digest,
        idempotency_key=key,
        external_request_id=new_id("req"),
        compensation_of=compensation_of,
    )
    call.save(force_insert=True)
    if dependencies:
        call.depends_on.set(dependencies)
    log_call_event(
        call,
        "tool_call.proposed",
        {
            "capability": capability.id,
            "capability_version": capability.version,
            "args": args,
            "args_digest": args_digest,
            "idempotency_key": key,
            "external_request_id": call.external_request_id,
            "intent": intent,
            "object_ref": object_ref,
            "object_revision": object_revision,
            "compensation_of": compensation_of.pk if compensation_of else None,
            "depends_on": [dependency.pk for dependency in dependencies or []],
            "summary": capability.summary(args),
        },
        actor=actor,
        producer="api",
    )
    needed = gate.requirement_for(call, capability)
    if needed.approvers:
        call_transition(
            call,
            "request_approval",
            actor=actor,
            producer="api",
            reason=f"policy v{needed.policy.version}: {needed.rule_name}",
        )
        call.save()
        gate.open_approval(
            call, capability, needed, actor=actor, producer="api", requested_by=requested_by
        )
    else:
        call_authorize(
            call,
            actor=actor,
            producer="api",
            reason=f"policy v{needed.policy.version} asks no approver",
        )
    return call


def call_authorize(
    call: ToolCall, *, actor: str, producer: str, reason: str, **details: Any
) -> None:
    call_transition(call, "authorize", actor=actor, producer=producer, reason=reason, **details)
    call.save()
    countdown = 0.0
    if call.next_attempt_at:
        countdown = max(0.0, (call.next_attempt_at - timezone.now()).total_seconds())
    outbox.enqueue(DISPATCH_TASK, call.pk, countdown=countdown)


# --- dispatch -------------------------------------------------------------------------------


@dataclass
class Claim:
    tool_call_id: str
    attempt_id: str
    fencing_token: int
    tenant_slug: str
    capability: Capability
    args: dict[str, Any]
    external_request_id: str
    idempotency_key: str
    # A success closes a half-open breaker; with a closed one there is nothing to write.
    breaker_closed: bool = True


@dataclass
class Outcome:
    kind: str  # confirmed | rejected | retryable | unknown
    error_name: str = ""
    message: str = ""
    http_status: int | None = None
    body: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
    replayed: bool = False


def dispatch(tool_call_id: str, *, outbox_id: str | None = None, worker: str = "") -> None:
    """Claim, send, record. Safe to run twice or concurrently for one call."""
    claim = _claim(tool_call_id, outbox_id, worker or worker_name())
    if claim is None:
        return
    crashpoint("before_send")
    outcome = send(claim)
    crashpoint("after_send")
    verify_now = record_outcome(claim, outcome)
    if verify_now:
        # Verify in this task, saving a Celery hop; its outbox message is the safety net.
        call, verify_outbox_id = verify_now
        verify(claim.tool_call_id, outbox_id=verify_outbox_id, call=call)


@transaction.atomic
def _claim(tool_call_id: str, outbox_id: str | None, worker: str) -> Claim | None:
    outbox.mark_done(outbox_id)
    call = lock_call(tool_call_id)
    if call is None or call.execution_status != E.AUTHORIZED:
        return None  # Somebody else claimed it, or it moved on: a duplicate message.
    now = timezone.now()
    if call.next_attempt_at and call.next_attempt_at > now + timedelta(milliseconds=100):
        return None  # Early: the message scheduled for next_attempt_at will come.
    run, system = call.run, "system:dispatcher"
    if not run.is_open:
        call_transition(
            call, "cancel", actor=system, producer="dispatcher", reason=f"run {run.state}"
        )
        call.save()
        return None
    capability = _capability(call)
    waiting_on = _unmet_dependencies(call, system)
    if waiting_on is not None:
        return None  # dispatched again when its dependencies are confirmed (or cancelled)
    refusal = _refuse_before_sending(call, run, now)
    if refusal:
        _fail_unsent(call, refusal, system)
        return None
    wait_until, breaker_closed = breaker.admit(call, now)
    if wait_until:
        call.next_attempt_at = wait_until
        call.save()
        log_call_event(
            call,
            "tool_call.deferred",
            {
                "error_name": "flow.circuit_open",
                "until": _iso(wait_until),
                "message": f"the circuit of {capability.id} is open",
            },
            actor=system,
            producer="dispatcher",
        )
        outbox.enqueue(DISPATCH_TASK, call.pk, countdown=(wait_until - now).total_seconds())
        return None
    admission = gate.admit_dispatch(call, capability, system)
    if admission == "needs_approval":
        needed = gate.requirement_for(call, capability)
        call_transition(
            call,
            "request_approval",
            actor=system,
            producer="dispatcher",
            reason="asked again: the arguments, object or policy changed",
        )
        call.save()
        gate.open_approval(
            call, capability, needed, actor=system, producer="dispatcher", requested_by=None
        )
        return None
    if admission != "ok":
        _fail_unsent(call, admission, system)
        return None
    call.fencing_token += 1
    number = call.fencing_token  # one claim, one attempt: their counts are the same
    lease = now + timedelta(seconds=_timeout(capability) + settings.LEASE_MARGIN_SECONDS)
    attempt = Attempt.objects.create(
        tool_call=call,
        run=run,
        number=number,
        fencing_token=call.fencing_token,
        worker=worker,
        started_at=now,
    )
    call.lease_expires_at = lease
    call.next_attempt_at = None
    call_transition(
        call,
        "claim",
        actor=system,
        producer="dispatcher",
        attempt_id=attempt.pk,
        attempt=number,
        fencing_token=call.fencing_token,
        lease_expires_at=_iso(lease),
    )
    call.save()
    return Claim(
        tool_call_id=call.pk,
        attempt_id=attempt.pk,
        fencing_token=call.fencing_token,
        tenant_slug=call.tenant.slug,
        capability=capability,
        args=call.args,
        external_request_id=call.external_request_id,
        idempotency_key=call.idempotency_key,
        breaker_closed=breaker_closed,
    )


def _fail_unsent(call: ToolCall, error: tuple[str, str], actor: str) -> None:
    """Fail a call that was never sent: (error name, message)."""
    call.last_error_name, call.last_error_message = error
    call_transition(
        call, "fail", actor=actor, producer="dispatcher", error_name=error[0], message=error[1]
    )
    call.save()


DEPENDENCY_FAILED = (
    E.FAILED,
    E.REJECTED,
    E.EXPIRED,
    E.CANCELLED,
    E.INVALIDATED,
    E.COMPENSATING,
    E.COMPENSATED,
    E.NEEDS_HUMAN,
)


def _unmet_dependencies(call: ToolCall, actor: str) -> list[ToolCall] | None:
    """None when every dependency is confirmed_success. A dependency that can no longer
    succeed cancels this call; one still on its way leaves it authorized, waiting."""
    dependencies = list(call.depends_on.all())
    broken = [
        d
        for d in dependencies
        if d.execution_status in DEPENDENCY_FAILED
        or d.verification_status in (V.CONFIRMED_FAILURE, V.INCONCLUSIVE)
    ]
    if broken:
        reason = ", ".join(
            f"{d.pk} is {d.execution_status}/{d.verification_status}" for d in broken
        )
        call_transition(
            call,
            "cancel",
            actor=actor,
            producer="dispatcher",
            reason=f"a dependency cannot succeed: {reason}",
        )
        call.save()
        return broken
    waiting = [d for d in dependencies if d.verification_status != V.CONFIRMED_SUCCESS]
    return waiting or None


def _refuse_before_sending(call: ToolCall, run: Run, now: datetime) -> tuple[str, str] | None:
    if Attempt.objects.filter(run=run).count() >= run.max_attempts:
        return "flow.budget_exceeded", f"run {run.pk} has used its {run.max_attempts} attempts"
    if run.deadline and now > run.deadline:
        return "flow.deadline_exceeded", f"run {run.pk} passed its deadline"
    if call.object_revision is not None:
        current = ObjectRevision.objects.filter(tenant_id=call.tenant_id, ref=call.object_ref)
        revision = current.values_list("revision", flat=True).first()
        if revision is not None and revision != call.object_revision:
            return (
                "precondition.conflict",
                f"{call.object_ref} moved from revision {call.object_revision} to {revision} "
                "since the call was computed; it was not sent",
            )
    return None


def send(claim: Claim) -> Outcome:
    """Call the external system once, and say what the answer proves."""
    capability = claim.capability
    request = capability.build_request(claim.args)
    headers = {"X-Request-Id": claim.external_request_id}
    if capability.kind == "write":
        headers["Idempotency-Key"] = claim.idempotency_key
    endpoint = connectors.endpoint_for(claim.tenant_slug, capability.system)
    try:
        response = connectors.request(
            endpoint,
            request.method,
            request.path,
            json=request.body,
            headers=headers,
            timeout=_timeout(capability),
        )
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        # The connection never opened: nothing was sent.
        return Outcome("retryable", "tool.unreachable", f"{type(exc).__name__}: {exc}")
    except httpx.TimeoutException as exc:
        return Outcome("unknown", "tool.timeout", f"no answer in time ({type(exc).__name__})")
    except httpx.TransportError as exc:
        # Sent, then the connection broke: the system may have done it.
        return Outcome("unknown", "tool.connection_lost", f"{type(exc).__name__}: {exc}")
    return classify(response)


def classify(response: httpx.Response) -> Outcome:
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = {"text": response.text[:500]}
    if not isinstance(body, dict):
        body = {"value": body}
    remote = f"{status} {body.get('error', '')}: {body.get('message', '')}".strip()
    if 200 <= status < 300:
        replayed = response.headers.get("Idempotent-Replayed", "").lower() == "true"
        return Outcome("confirmed", http_status=status, body=body, replayed=replayed)
    if status == 429:
        retry_after = response.headers.get("Retry-After", "")
        return Outcome(
            "retryable",
            "tool.rate_limited",
            remote,
            status,
            retry_after=float(retry_after) if retry_after.isdigit() else None,
        )
    if status in (502, 503):
        # The gateway or the service refused before processing: safe to send again.
        return Outcome("retryable", "tool.upstream_5xx", remote, status)
    if status >= 500:
        # A 500 or 504 may come after the work was done.
        return Outcome("unknown", "tool.upstream_5xx", remote, status)
    if status in (401, 403):
        return Outcome("rejected", "tool.auth_failed", remote, status)
    if status == 400:
        return Outcome("rejected", "tool.validation_failed", remote, status)
    return Outcome("rejected", "tool.rejected", remote, status)


def backoff(policy: capabilities.RetryPolicy, failures: int, retry_after: float | None) -> float:
    """Exponential backoff with full jitter, never sooner than the system's Retry-After."""
    ceiling = min(policy.max_delay, policy.base_delay * 2 ** (failures - 1))
    return max(retry_after or 0.0, random.uniform(ceiling / 2, ceiling))


@transaction.atomic
def record_outcome(claim: Claim, outcome: Outcome) -> tuple[ToolCall, str] | None:
    """Record what the answer proves, if this claim is still current. Returns the call and
    the id of its verification's outbox message when the caller should verify right away."""
    call = lock_call(claim.tool_call_id)
    now = timezone.now()
    attempt = Attempt.objects.filter(pk=claim.attempt_id)
    ended = {"ended_at": now, "error_name": outcome.error_name, "http_status": outcome.http_status}
    system = "system:dispatcher"
    if call.fencing_token != claim.fencing_token or call.execution_status != E.DISPATCHING:
        # A late or paused worker: its lease was given up and the call moved on without it.
        attempt.update(classification=Attempt.Classification.STALE, **ended)
        log.warning(
            "refused stale result for %s (token %s, now %s, %s)",
            call.pk,
            claim.fencing_token,
            call.fencing_token,
            call.execution_status,
        )
        log_call_event(
            call,
            "tool_call.stale_result_refused",
            {
                "attempt_id": claim.attempt_id,
                "fencing_token": claim.fencing_token,
                "current_token": call.fencing_token,
                "status_now": call.execution_status,
                "outcome": outcome.kind,
                "external_id": str(outcome.body.get(claim.capability.external_id_field, "")),
            },
            actor=system,
            producer="dispatcher",
        )
        return
    classification = {
        "confirmed": Attempt.Classification.CONFIRMED,
        "rejected": Attempt.Classification.REJECTED,
        "retryable": Attempt.Classification.RETRYABLE,
        "unknown": Attempt.Classification.UNKNOWN,
    }[outcome.kind]
    attempt.update(classification=classification, **ended)
    call.lease_expires_at = None
    capability = claim.capability
    if outcome.kind == "confirmed":
        status = Receipt.Status.ALREADY_EXISTS if outcome.replayed else Receipt.Status.CREATED
        verify_outbox_id = accept(
            call,
            capability,
            outcome.body,
            source=Receipt.Source.DISPATCH,
            status=status,
            attempt_id=claim.attempt_id,
            actor=system,
            verify_here=True,
        )
        if not claim.breaker_closed:
            breaker.record_success(call)
        return (call, verify_outbox_id) if verify_outbox_id else None
    call.last_error_name, call.last_error_message = outcome.error_name, outcome.message
    breaker.record_failure(call, outcome.error_name, now)
    details = {
        "error_name": outcome.error_name,
        "message": outcome.message,
        "http_status": outcome.http_status,
        "attempt_id": claim.attempt_id,
    }
    if outcome.kind == "rejected":
        call_transition(call, "fail", actor=system, producer="dispatcher", **details)
        call.save()
        return
    if outcome.kind == "unknown":
        call_transition(call, "mark_unknown", actor=system, producer="dispatcher", **details)
        call.save()
        outbox.enqueue(RECONCILE_TASK, call.pk, countdown=capability.consistency_window)
        return
    policy = capability.retry.get(outcome.error_name)
    failures = call.attempts.filter(error_name=outcome.error_name).count()
    if policy is None or failures >= policy.max_attempts:
        details["message"] = f"gave up after {failures} attempts: {outcome.message}"
        call_transition(call, "fail", actor=system, producer="dispatcher", **details)
        call.save()
        return
    delay = backoff(policy, failures, outcome.retry_after)
    call.next_attempt_at = now + timedelta(seconds=delay)
    call_authorize(
        call,
        actor=system,
        producer="dispatcher",
        reason=f"retry after {outcome.error_name}: nothing was executed",
        delay_seconds=round(delay, 3),
        next_attempt_at=_iso(call.next_attempt_at),
        **details,
    )


def accept(
    call: ToolCall,
    capability: Capability,
    body: dict[str, Any],
    *,
    source: str,
    status: str,
    actor: str,
    attempt_id: str | None = None,
    evidence: str = "",
    verify_here: bool = False,
) -> str | None:
    """The system did this operation: keep its receipt, complete, and start verification.
    With `verify_here` the caller verifies right after commit (the returned outbox message
    id is the safety net); otherwise a verification task is queued."""
    producer = "dispatcher" if source == Receipt.Source.DISPATCH else "reconciler"
    external_id = str(body.get(capability.external_id_field, ""))
    receipt = Receipt.objects.create(
        tool_call=call,
        attempt_id=attempt_id,
        external_id=external_id,
        status=status,
        source=source,
        raw_response=body,
    )
    call.external_id, call.result = external_id, body
    call_transition(
        call,
        "accept",
        actor=actor,
        producer=producer,
        receipt_id=receipt.pk,
        external_id=external_id,
        receipt_status=status,
        source=source,
        evidence=evidence,
    )
    if capability.completes_on_response:
        call_transition(call, "complete", actor=actor, producer=producer)
        if capability.kind == "write":
            # The object changed: calls computed from its old revision must not run.
            moved = ObjectRevision.objects.filter(
                tenant_id=call.tenant_id, ref=call.object_ref
            ).update(revision=F("revision") + 1)
            if moved:
                gate.invalidate_for_object(call, call.object_ref, actor)
    if capability.verify is None:
        call_transition(
            call,
            "confirm_success",
            actor=actor,
            producer=producer,
            reason="a read observes the system itself",
        )
        call.save()
        return None
    call_transition(call, "await_verification", actor=actor, producer=producer)
    message = outbox.enqueue(VERIFY_TASK, call.pk, publish_now=not verify_here)
    call.save()
    return message.pk if verify_here else None


# --- reconcile ------------------------------------------------------------------------------


def reconcile(tool_call_id: str, *, outbox_id: str | None = None) -> None:
    """Look an unknown outcome up at the external system before anything is sent again.

    Its outbox message is marked done with the result, in the last transaction: a worker
    that dies in the middle leaves it undone, and the sweeper sends it again."""
    call = ToolCall.objects.select_related("tenant").filter(pk=tool_call_id).first()
    if call is None or call.execution_status not in (E.RESULT_UNKNOWN, E.NEEDS_HUMAN):
        _done(outbox_id)
        return
    capability = _capability(call)
    token = call.fencing_token
    found, body, error_name = look_up(call, capability)
    with transaction.atomic():
        outbox.mark_done(outbox_id)
        call = lock_call(tool_call_id)
        if call.fencing_token != token or call.execution_status not in (
            E.RESULT_UNKNOWN,
            E.NEEDS_HUMAN,
        ):
            return
        _apply_lookup(call, capability, found, body, error_name)


def _done(outbox_id: str | None) -> None:
    with transaction.atomic():
        outbox.mark_done(outbox_id)


def look_up(call: ToolCall, capability: Capability) -> tuple[bool, dict[str, Any], str]:
    """(found, body, error name); an error name means the look-up proved nothing."""
    if capability.lookup_path is None:
        return False, {}, "tool.no_lookup"
    endpoint = connectors.endpoint_for(call.tenant.slug, capability.system)
    try:
        response = connectors.request(
            endpoint,
            "GET",
            capability.lookup_path,
            params={"request_id": call.external_request_id},
            timeout=_timeout(capability),
        )
    except httpx.HTTPError as exc:
        return False, {}, f"tool.lookup_failed ({type(exc).__name__})"
    if response.status_code == 200:
        return True, response.json(), ""
    if response.status_code == 404:
        return False, {}, ""
    return False, {}, f"tool.lookup_failed ({response.status_code})"


def _apply_lookup(
    call: ToolCall, capability: Capability, found: bool, body: dict[str, Any], error_name: str
) -> None:
    system = "system:reconciler"
    now = timezone.now()
    call.lookups += 1
    last_attempt = call.attempts.order_by("-number").first()
    sent_at = (last_attempt.ended_at or last_attempt.started_at) if last_attempt else now
    elapsed = (now - sent_at).total_seconds()
    within_window = elapsed < capability.consistency_window
    log_call_event(
        call,
        "tool_call.looked_up",
        {
            "found": found,
            "lookup": call.lookups,
            "within_consistency_window": within_window,
            **({"error_name": error_name} if error_name else {}),
            **({"external_id": str(body.get(capability.external_id_field, ""))} if found else {}),
        },
        actor=system,
        producer="reconciler",
    )
    if found:
        accept(
            call,
            capability,
            body,
            source=Receipt.Source.LOOKUP,
            status=Receipt.Status.CREATED,
            actor=system,
        )
        resume_run_if_resolved(call.run_id, system, producer="reconciler")
        return
    if call.execution_status == E.NEEDS_HUMAN:
        call.save()
        return  # A person owns it now; a miss changes nothing.
    if error_name == "tool.no_lookup" and capability.remote_dedupe_window:
        # No look-up, but the system deduplicates our key: sending again cannot double it.
        call_authorize(
            call,
            actor=system,
            producer="reconciler",
            reason="no look-up; the system deduplicates this idempotency key",
        )
        return
    if not error_name and not within_window:
        call_authorize(
            call,
            actor=system,
            producer="reconciler",
            reason=f"look-up found nothing {elapsed:.1f} s after sending, past the "
            f"{capability.consistency_window} s consistency window: never executed",
        )
        return
    if call.lookups >= capability.max_lookups or error_name == "tool.no_lookup":
        call_hand_to_human(call, system, f"outcome still unknown after {call.lookups} look-ups")
        return
    wait = capability.consistency_window - elapsed if within_window else 2.0**call.lookups
    call.save()
    outbox.enqueue(RECONCILE_TASK, call.pk, countdown=max(wait, 0.5))


def resume_run_if_resolved(run_id: str, actor: str, *, producer: str) -> None:
    """A run handed to a person goes on once none of its outcomes is unknown."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.state != Run.State.NEEDS_HUMAN:
        return
    if ToolCall.objects.filter(
        run=run, execution_status__in=(E.RESULT_UNKNOWN, E.NEEDS_HUMAN)
    ).exists():
        return
    run_transition(
        run, "resume", actor=actor, producer=producer, reason="every unknown outcome is resolved"
    )


def call_hand_to_human(call: ToolCall, actor: str, reason: str) -> None:
    call_transition(call, "hand_to_human", actor=actor, producer="reconciler", reason=reason)
    call.save()
    run = Run.objects.select_for_update().get(pk=call.run_id)
    if run.state in (Run.State.ACTIVE, Run.State.WAITING):
        run_transition(
            run, "hand_to_human", actor=actor, producer="reconciler", reason=f"{call.pk}: {reason}"
        )


# --- verify ---------------------------------------------------------------------------------


def verify(
    tool_call_id: str, *, outbox_id: str | None = None, call: ToolCall | None = None
) -> None:
    """Observe domain reality for an accepted call (DESIGN section 4, verification). Like
    reconcile, it marks its outbox message done only with its result. `call` is the dispatcher's
    copy of it, just committed, which saves reading it again; it is locked again to write."""
    if call is None:
        call = ToolCall.objects.select_related("tenant").filter(pk=tool_call_id).first()
    if call is None or call.verification_status != V.PENDING:
        _done(outbox_id)
        return
    capability = _capability(call)
    try:
        judgment = capability.verify(TrustedData(call.tenant.slug), call.external_id, call.args)
    except UpstreamUnavailable:
        judgment = "unavailable"
    with transaction.atomic():
        outbox.mark_done(outbox_id)
        call = lock_call(tool_call_id)
        if call.verification_status != V.PENDING:
            return
        call.verifications += 1
        system = "system:verifier"
        if judgment in ("confirmed_success", "confirmed_failure"):
            action = "confirm_success" if judgment == "confirmed_success" else "confirm_failure"
            call_transition(call, action, actor=system, producer="verifier")
            call.save()
            if action == "confirm_success" and call.compensation_of_id:
                _finish_compensation(call, system)
            _wake_dependents(call)
            return
        if call.verifications >= MAX_VERIFICATIONS:
            call_transition(
                call,
                "find_inconclusive",
                actor=system,
                producer="verifier",
                reason=f"{judgment} after {call.verifications} observations",
            )
            call.save()
            return
        call.save()
        outbox.enqueue(VERIFY_TASK, call.pk, countdown=0.5 * 2**call.verifications)


def _wake_dependents(call: ToolCall) -> None:
    for dependent_id in call.dependents.filter(execution_status=E.AUTHORIZED).values_list(
        "pk", flat=True
    ):
        outbox.enqueue(DISPATCH_TASK, dependent_id)


def _finish_compensation(compensation: ToolCall, actor: str) -> None:
    original = lock_call(compensation.compensation_of_id)
    if original.execution_status == E.COMPENSATING:
        call_transition(
            original,
            "finish_compensation",
            actor=actor,
            producer="verifier",
            reason=f"compensated by {compensation.pk}",
        )
        original.save()


# --- commands -------------------------------------------------------------------------------


def tool_call_retry(*, tenant: Tenant, tool_call_id: str, actor: str) -> ToolCall:
    """Send a failed call again with the same key, when the failure proved nothing happened."""
    with transaction.atomic():
        call = _lock_for_tenant(tenant, tool_call_id)
        if call.execution_status == E.RESULT_UNKNOWN:
            raise DomainError(
                "tool_call.outcome_unknown",
                "The operation may have happened: reconcile it (look it up) instead.",
            )
        if call.execution_status != E.FAILED or call.last_error_name not in NOT_EXECUTED_ERRORS:
            raise DomainError(
                "tool_call.not_retryable",
                f"Only a call that failed without executing can be retried; this one is "
                f"{call.execution_status} ({call.last_error_name or 'no error'}).",
            )
        if not call.run.is_open:
            raise DomainError("run.closed", f"Run {call.run_id} is {call.run.state}.")
        call.next_attempt_at = None
        call_authorize(call, actor=actor, producer="api", reason="retry asked; same key")
        return call


def tool_call_reconcile_now(*, tenant: Tenant, tool_call_id: str, actor: str) -> ToolCall:
    with transaction.atomic():
        call = _lock_for_tenant(tenant, tool_call_id)
        if call.execution_status not in (E.RESULT_UNKNOWN, E.NEEDS_HUMAN):
            raise DomainError(
                "tool_call.not_unknown",
                f"Only an unknown outcome is looked up; this call is {call.execution_status}.",
            )
        outbox.enqueue(RECONCILE_TASK, call.pk)
        return call


def tool_call_compensate(*, tenant: Tenant, tool_call_id: str, actor: str) -> tuple[ToolCall, bool]:
    """Undo a confirmed call with its compensating capability; twice gives the same call."""
    original = ToolCall.objects.filter(tenant=tenant, pk=tool_call_id).first()
    if original is None:
        raise not_found("tool call", tool_call_id)
    existing = ToolCall.objects.filter(compensation_of=original).first()
    if existing:
        return existing, False
    capability = _capability(original)
    if not capability.compensation:
        raise DomainError(
            "compensation.not_available", f"{capability.id} has no compensating capability."
        )
    if original.verification_status != V.CONFIRMED_SUCCESS:
        raise DomainError(
            "compensation.not_confirmed",
            f"Only a confirmed outcome is compensated; this call is {original.execution_status} "
            f"(verification {original.verification_status}).",
        )
    compensating = capabilities.get(capability.compensation)
    args = capability.compensation_args(original.external_id, original.args)
    problems = business_check(tenant, compensating, args)
    if problems:
        raise _invalid(problems)
    object_ref = compensating.object_ref(args)
    key = idempotency_key(tenant, compensating, object_ref, f"compensate:{original.pk}")
    try:
        with transaction.atomic():
            original = _lock_for_tenant(tenant, tool_call_id)
            call_transition(
                original,
                "start_compensation",
                actor=actor,
                producer="api",
                reason="compensation asked",
            )
            original.save()
            call = _create_call(
                run=Run.objects.select_for_update().get(pk=original.run_id),
                capability=compensating,
                args=args,
                args_digest=digest(args),
                key=key,
                intent=f"compensate:{original.pk}",
                object_ref=object_ref,
                object_revision=None,
                decision=original.decision,
                actor=actor,
                compensation_of=original,
            )
    except IntegrityError:
        return ToolCall.objects.get(compensation_of_id=tool_call_id), False
    return call, True


@transaction.atomic
def run_stop(*, tenant: Tenant, run_id: str, actor: str, reason: str = "") -> tuple[Run, list]:
    """Cancel the run and every call not yet dispatched; report the calls still in flight
    (their outcome is still recorded when it comes; it does not reopen the run)."""
    run = Run.objects.select_for_update().filter(tenant=tenant, pk=run_id).first()
    if run is None:
        raise not_found("run", run_id)
    in_flight = cancel_open_calls(run, actor=actor, reason=reason or "run stopped")
    if run.state != Run.State.CANCELLED:
        run_transition(run, "cancel", actor=actor, reason=reason, producer="api")
    return run, in_flight


WORK_IN_FLIGHT = (
    E.PROPOSED,
    E.AWAITING_APPROVAL,
    E.AUTHORIZED,
    E.DISPATCHING,
    E.ACCEPTED,
    E.COMPENSATING,
)
DEGRADED = (E.FAILED, E.REJECTED, E.EXPIRED, E.INVALIDATED, E.CANCELLED)


@transaction.atomic
def run_finish(
    *,
    tenant: Tenant,
    run_id: str,
    actor: str,
    failed_permanently: bool = False,
    reason: str = "",
) -> Run:
    """End a run with its exit type, judged from its calls: completed (every call
    verified), completed_with_degradation (some did not succeed), needs_human (some outcome is
    unknown), or failed_permanently when the agent says the task cannot be done."""
    run = Run.objects.select_for_update().filter(tenant=tenant, pk=run_id).first()
    if run is None:
        raise not_found("run", run_id)
    if run.state not in (Run.State.ACTIVE, Run.State.WAITING):
        raise DomainError("run.invalid_state", f"Run {run.pk} is {run.state} already.")
    calls = list(ToolCall.objects.filter(run=run))
    moving = [
        c
        for c in calls
        if c.execution_status in WORK_IN_FLIGHT or c.verification_status == V.PENDING
    ]
    if moving:
        raise DomainError(
            "run.work_in_flight",
            f"{', '.join(c.pk for c in moving)} still on their way: wait for them, or stop "
            "the run (POST /stop) to cancel what is not dispatched.",
            details=[
                {"tool_call_id": c.pk, "execution_status": c.execution_status} for c in moving
            ],
        )
    unknown = [c for c in calls if c.execution_status in (E.RESULT_UNKNOWN, E.NEEDS_HUMAN)]
    degraded = [
        c
        for c in calls
        if c.execution_status in DEGRADED
        or c.verification_status in (V.CONFIRMED_FAILURE, V.INCONCLUSIVE)
    ]
    if unknown:
        action = "hand_to_human"
        reason = reason or f"unknown outcomes: {', '.join(c.pk for c in unknown)}"
    elif failed_permanently:
        action = "fail_permanently"
    elif degraded:
        action = "complete_with_degradation"
        reason = reason or f"did not succeed: {', '.join(c.pk for c in degraded)}"
    else:
        action = "complete"
    if run.state == Run.State.WAITING and action != "hand_to_human":
        run_transition(run, "resume", actor=actor, producer="api", reason="finishing")
    return run_transition(run, action, actor=actor, producer="api", reason=reason)


def cancel_open_calls(run: Run, *, actor: str, reason: str) -> list[ToolCall]:
    """Cancel what is not yet dispatched; return the calls still in flight. The run is locked."""
    in_flight = []
    for call in ToolCall.objects.select_for_update().filter(run=run).select_related("run"):
        if call.execution_status in (E.PROPOSED, E.AWAITING_APPROVAL, E.AUTHORIZED):
            call_transition(call, "cancel", actor=actor, producer="api", reason=reason)
            call.save()
        elif call.execution_status in (E.DISPATCHING, E.RESULT_UNKNOWN, E.ACCEPTED):
            in_flight.append(call)
    return in_flight


# --- sweep ----------------------------------------------------------------------------------


def sweep_expired_leases(limit: int = 500) -> int:
    """A worker that died mid-call leaves its lease to expire: its call is unknown, not
    "never called", and goes to reconciliation."""
    now = timezone.now()
    expired = list(
        ToolCall.objects.filter(
            execution_status=E.DISPATCHING, lease_expires_at__lt=now
        ).values_list("pk", flat=True)[:limit]
    )
    swept = 0
    for tool_call_id in expired:
        with transaction.atomic():
            call = lock_call(tool_call_id)
            if call.execution_status != E.DISPATCHING or call.lease_expires_at >= now:
                continue
            Attempt.objects.filter(
                tool_call=call,
                fencing_token=call.fencing_token,
                classification=Attempt.Classification.IN_FLIGHT,
            ).update(
                classification=Attempt.Classification.UNKNOWN,
                error_name="tool.lease_expired",
                ended_at=now,
            )
            call.lease_expires_at = None
            call.last_error_name = "tool.lease_expired"
            call.last_error_message = "the worker's lease expired; it may have sent the request"
            call_transition(
                call,
                "mark_unknown",
                actor="system:sweeper",
                producer="sweeper",
                error_name="tool.lease_expired",
                message=call.last_error_message,
            )
            call.save()
            outbox.enqueue(RECONCILE_TASK, call.pk)
            swept += 1
    return swept


def sweep_waiting_dependents(limit: int = 500) -> int:
    """Authorized calls waiting on dependencies that have all settled (a failure cancels
    them at their claim, a success dispatches them): send each a dispatch."""
    waiting = (
        ToolCall.objects.filter(execution_status=E.AUTHORIZED, depends_on__isnull=False)
        .distinct()
        .prefetch_related("depends_on")[:limit]
    )
    woken = 0
    for call in waiting:
        if all(dependency.is_settled for dependency in call.depends_on.all()):
            with transaction.atomic():
                outbox.enqueue(DISPATCH_TASK, call.pk)
            woken += 1
    return woken
