"""Dispatch: claim, send, classify, record (DESIGN section 6).

The external system is called between two transactions, never inside one: the claim (fencing
token, lease, attempt, `dispatching`) commits first, the outcome is recorded after, and only if
the claim's token is still current. A lost answer is `result_unknown`, never "failed".
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs import dbvalues, events, outbox, pipeline, transitions
from runs import sql as runs_sql
from runs.faults import crashpoint
from runs.models import Run
from toolcalls import breaker, capabilities, errors, gate, sql
from toolcalls.capabilities import Capability
from toolcalls.models import Attempt, CircuitBreaker, E, ObjectRevision, Receipt, ToolCall
from toolcalls.record import RecordWrites, external_id_of, tool_call_accept
from toolcalls.send import Outcome, backoff, send
from toolcalls.verify import judge, observe_answer
from toolcalls.writes import (
    DISPATCH_TASK,
    RECONCILE_TASK,
    timeout_of,
    tool_call_event,
    tool_call_lock,
    tool_call_transition,
)

log = logging.getLogger(__name__)
SYSTEM = "system:dispatcher"


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


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
    run_id: str = ""  # for log lines


def tool_call_dispatch(
    *, tool_call_id: str, outbox_id: str | None = None, worker: str = ""
) -> None:
    """Claim, send, record. Safe to run twice or concurrently for one call."""
    claim = tool_call_claim(tool_call_id=tool_call_id, outbox_id=outbox_id, worker=worker)
    if claim is None:
        return
    crashpoint("before_send")
    outcome = send(claim)
    crashpoint("after_send")
    # Verified in this task, saving a Celery hop: observed before the record, so that the
    # answer and its verification are written in one transaction. Without a judgment (the
    # observation raised or timed out) the call is recorded accepted, and its verification's
    # outbox message runs later.
    judgment = observe_sent(claim, outcome)
    try:
        record_outcome(claim, outcome, judgment)
    except Exception:
        if judgment is None:
            raise
        # The answer must not be lost with the judgment: recorded alone, verified later.
        log.exception("recording %s with its verification failed", claim.tool_call_id)
        record_outcome(claim, outcome)


# How long a dispatch waits for the observation of an answer before it records without it.
# The claim's lease has LEASE_MARGIN_SECONDS (10) beyond the send's timeout: the record must
# commit well before it runs out, or the sweeper hands the answered call to reconciliation.
OBSERVE_SECONDS = 2.0


def observable(claim: Claim, outcome: Outcome) -> bool:
    """Whether the answer will be accepted and verified by looking at the system."""
    return outcome.kind == "confirmed" and claim.capability.verify is not None


def observe_sent(claim: Claim, outcome: Outcome) -> str | None:
    """The verification's observation of an answer that will be accepted, made before it is
    recorded (the external system's state does not wait for our commit; no database here).
    None when there is nothing to observe or the observation raised."""
    if not observable(claim, outcome):
        return None
    external_id = external_id_of(claim.capability, outcome.body)
    try:
        return observe_answer(
            claim.capability, claim.tenant_slug, external_id, claim.args, timeout=OBSERVE_SECONDS
        )
    except Exception:
        log.exception("observing %s raised; its verification message will run", claim.tool_call_id)
        return None


# --- claim ----------------------------------------------------------------------------------


@transaction.atomic
def tool_call_claim(*, tool_call_id: str, outbox_id: str | None, worker: str = "") -> Claim | None:
    """Take the call for one attempt, or say why not now (None). Nothing is sent here."""
    # An approved call's claim is on the approver's clock: its writes go with its next read or
    # together at the end, not one round trip each (runs/pipeline.py).
    with pipeline.writes_together(), events.batch():
        return _claim(tool_call_id, outbox_id, worker)


def _claim(tool_call_id: str, outbox_id: str | None, worker: str) -> Claim | None:
    outbox.mark_done(outbox_id)
    call = tool_call_lock(tool_call_id)
    if call is None:
        return None
    attempts: list[Attempt] = []
    claim = claim_locked(call, timezone.now(), worker, attempts=attempts)
    runs_sql.insert_rows(attempts)  # written out: the ORM's compiling was most of it
    if claim is not None:
        crashpoint("inside_claim")  # uncommitted, holding the call's row lock and its run's
    return claim


def claim_locked(
    call: ToolCall,
    now: datetime,
    worker: str,
    *,
    attempts: list[Attempt],
    ready: sql.Readiness | None = None,
) -> Claim | None:
    """The checks and the claim of one call whose row the caller has locked. The attempt of a
    claim is appended to `attempts`, for the caller to insert (a batch inserts all of them in
    one statement). `ready` is what sql.readiness would answer now (read here when None)."""
    if call.execution_status != E.AUTHORIZED:
        return None  # Somebody else claimed it, or it moved on: a duplicate message.
    if call.next_attempt_at and call.next_attempt_at > now + timedelta(milliseconds=100):
        return None  # Early: the message scheduled for next_attempt_at will come.
    if not call.run.is_open:
        tool_call_transition(
            call, "cancel", actor=SYSTEM, producer="dispatcher", reason=f"run {call.run.state}"
        )
        return None
    capability = capabilities.get(call.capability_id)
    if capability is None:
        # Its contract left the code: fail it unsent, in this transaction, so the message is
        # done and the call says why (a retry once the contract is back sends it).
        _fail_unsent(call, (errors.CAPABILITY_UNKNOWN, f"{call.capability_id} is not registered"))
        return None
    ready = ready or sql.readiness(call)
    if not _ready_to_send(call, capability, now, ready):
        return None
    breaker_closed = _deferred_by_breaker(call, capability, now, ready)
    if breaker_closed is None:
        return None
    admission = gate.tool_call_admit(
        call=call, capability=capability, actor=SYSTEM, newest_policy_id=ready.newest_policy_id
    )
    if admission == "needs_approval":
        gate.tool_call_hold_for_approval(
            call=call,
            capability=capability,
            needed=gate.requirement_for(call, capability),
            actor=SYSTEM,
            producer="dispatcher",
            reason="asked again: the arguments, object or policy changed",
            requested_by=None,
        )
        return None
    if admission != "ok":
        _fail_unsent(call, admission)
        return None
    return _take(call, capability, now, worker or worker_name(), breaker_closed, attempts)


def _ready_to_send(
    call: ToolCall, capability: Capability, now: datetime, ready: sql.Readiness
) -> bool:
    """Dependencies confirmed, budgets and deadline left, the object still at its revision.
    A refusal here is written (cancelled or failed); waiting on dependencies writes nothing."""
    if ready.has_dependencies and _unmet_dependencies(call) is not None:
        return False  # dispatched again when its dependencies are confirmed (or cancelled)
    refusal = _refusal_before_sending(call, call.run, now, ready.attempts_in_run)
    if refusal:
        _fail_unsent(call, refusal)
        return False
    return True


def _deferred_by_breaker(
    call: ToolCall, capability: Capability, now: datetime, ready: sql.Readiness
) -> bool | None:
    """None when the capability's circuit is open (the call waits, with an event saying so);
    otherwise whether the breaker was closed."""
    if ready.breaker_state in (None, CircuitBreaker.State.CLOSED):
        return True  # what breaker.admit answers for these, without reading the row again
    wait_until, breaker_closed = breaker.admit(call, now)
    if not wait_until:
        return breaker_closed
    call.next_attempt_at = wait_until
    call.save(update_fields=["next_attempt_at", "updated_at"])
    tool_call_event(
        call,
        "tool_call.deferred",
        {
            "error_name": errors.CIRCUIT_OPEN,
            "until": wait_until.isoformat(),
            "message": f"the circuit of {capability.id} is open",
        },
        actor=SYSTEM,
        producer="dispatcher",
    )
    outbox.enqueue(DISPATCH_TASK, call.pk, countdown=(wait_until - now).total_seconds())
    return None


def _take(
    call: ToolCall,
    capability: Capability,
    now: datetime,
    worker: str,
    breaker_closed: bool,
    attempts: list[Attempt],
) -> Claim:
    """Fencing token + 1, a lease, an attempt (inserted by the caller), `dispatching`."""
    call.fencing_token += 1
    number = call.fencing_token  # one claim, one attempt: their counts are the same
    lease = now + timedelta(seconds=timeout_of(capability) + settings.LEASE_MARGIN_SECONDS)
    # Attempt(...) less Model.__init__'s loop (runs/dbvalues.py): one per claim.
    attempt = dbvalues.new(
        Attempt,
        {
            "tool_call": call,
            "run": call.run,
            "number": number,
            "fencing_token": call.fencing_token,
            "worker": worker,
            "started_at": now,
        },
    )
    attempts.append(attempt)
    call.lease_expires_at = lease
    call.next_attempt_at = None
    tool_call_transition(
        call,
        "claim",
        actor=SYSTEM,
        producer="dispatcher",
        attempt_id=attempt.id,
        attempt=number,
        fencing_token=call.fencing_token,
        lease_expires_at=lease.isoformat(),
    )
    return Claim(
        tool_call_id=call.id,
        attempt_id=attempt.id,
        fencing_token=call.fencing_token,
        tenant_slug=call.tenant.slug,
        capability=capability,
        args=call.args,
        external_request_id=call.external_request_id,
        idempotency_key=call.idempotency_key,
        breaker_closed=breaker_closed,
        run_id=call.run_id,
    )


def _fail_unsent(call: ToolCall, error: tuple[str, str]) -> None:
    """Fail a call that was never sent: (error name, message)."""
    call.last_error_name, call.last_error_message = error
    tool_call_transition(
        call, "fail", actor=SYSTEM, producer="dispatcher", error_name=error[0], message=error[1]
    )


def _unmet_dependencies(call: ToolCall) -> list[ToolCall] | None:
    """None when every dependency is confirmed_success. A dependency that can no longer
    succeed cancels this call; one still on its way leaves it authorized, waiting."""
    dependencies = list(call.depends_on.all())
    broken = [d for d in dependencies if d.cannot_succeed]
    if broken:
        reason = ", ".join(
            f"{d.pk} is {d.execution_status}/{d.verification_status}" for d in broken
        )
        tool_call_transition(
            call,
            "cancel",
            actor=SYSTEM,
            producer="dispatcher",
            reason=f"a dependency cannot succeed: {reason}",
        )
        return broken
    waiting = [d for d in dependencies if not d.is_verified]
    return waiting or None


def _refusal_before_sending(
    call: ToolCall, run: Run, now: datetime, attempts_in_run: int
) -> tuple[str, str] | None:
    if attempts_in_run >= run.max_attempts:
        return errors.BUDGET_EXCEEDED, f"run {run.pk} has used its {run.max_attempts} attempts"
    if run.deadline and now > run.deadline:
        return errors.DEADLINE_EXCEEDED, f"run {run.pk} passed its deadline"
    if call.object_revision is not None:
        current = ObjectRevision.objects.filter(tenant_id=call.tenant_id, ref=call.object_ref)
        revision = current.values_list("revision", flat=True).first()
        if revision is not None and revision != call.object_revision:
            return (
                errors.PRECONDITION_CONFLICT,
                f"{call.object_ref} moved from revision {call.object_revision} to {revision} "
                "since the call was computed; it was not sent",
            )
    return None


# --- record ---------------------------------------------------------------------------------

CLASSIFICATION = {
    "confirmed": Attempt.Classification.CONFIRMED,
    "rejected": Attempt.Classification.REJECTED,
    "retryable": Attempt.Classification.RETRYABLE,
    "unknown": Attempt.Classification.UNKNOWN,
}


@transaction.atomic
def record_outcome(
    claim: Claim, outcome: Outcome, judgment: str | None = None
) -> tuple[ToolCall, str] | None:
    """Record what the answer proves, if this claim is still current, and with `judgment` (its
    observation, made already) the verification of the accepted call. Returns the call and
    the id of its verification's outbox message when it is accepted and not judged here."""
    with events.batch():
        return _record(claim, outcome, judgment)


def _record(claim: Claim, outcome: Outcome, judgment: str | None) -> tuple[ToolCall, str] | None:
    writes = RecordWrites()
    call = tool_call_lock(claim.tool_call_id)
    # Saved once, when its record and its verification are both written.
    with transitions.saved_once(call):
        verify_now = record_locked(call, claim, outcome, timezone.now(), writes=writes)
        if verify_now and judgment:
            writes.verified_already({verify_now[1]})
        writes.flush()
        if verify_now and judgment:
            judge(call.pk, None, judgment, locked=call)
            return None
    return verify_now


def record_locked(
    call: ToolCall, claim: Claim, outcome: Outcome, now: datetime, *, writes: RecordWrites
) -> tuple[ToolCall, str] | None:
    """`_record` for a call whose row the caller has locked. The call is saved once, at the
    end, whatever transitions it took; the attempt's end, the receipt, the revision and the
    verification's message go to `writes`, which the caller flushes (a batch, once for all
    its calls)."""
    with transitions.saved_once(call):
        return _record_locked(call, claim, outcome, now, writes)


def _record_locked(
    call: ToolCall, claim: Claim, outcome: Outcome, now: datetime, writes: RecordWrites
) -> tuple[ToolCall, str] | None:
    if call.fencing_token != claim.fencing_token or call.execution_status != E.DISPATCHING:
        writes.end_attempt(claim.attempt_id, Attempt.Classification.STALE, now, outcome)
        _refuse_stale(call, claim, outcome)
        return None
    writes.end_attempt(claim.attempt_id, CLASSIFICATION[outcome.kind], now, outcome)
    call.lease_expires_at = None
    if outcome.kind == "confirmed":
        status = Receipt.Status.ALREADY_EXISTS if outcome.replayed else Receipt.Status.CREATED
        verify_outbox_id = tool_call_accept(
            call=call,
            capability=claim.capability,
            body=outcome.body,
            source=Receipt.Source.DISPATCH,
            status=status,
            attempt_id=claim.attempt_id,
            actor=SYSTEM,
            verify_here=True,
            writes=writes,
        )
        if not claim.breaker_closed:
            breaker.record_success(call)
        return (call, verify_outbox_id) if verify_outbox_id else None
    call.last_error_name, call.last_error_message = outcome.error_name, outcome.message
    # The breaker and the retry policy count attempts by how they ended, this one included.
    writes.flush_attempt_ends()
    breaker.record_failure(call, outcome.error_name, now)
    _record_failure(call, claim, outcome, now)
    return None


def _refuse_stale(call: ToolCall, claim: Claim, outcome: Outcome) -> None:
    """A late or paused worker: its lease was given up and the call moved on without it."""
    log.warning(
        "refused stale result for %s (token %s, now %s, %s)",
        call.pk,
        claim.fencing_token,
        call.fencing_token,
        call.execution_status,
    )
    tool_call_event(
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
        actor=SYSTEM,
        producer="dispatcher",
    )


def _record_failure(call: ToolCall, claim: Claim, outcome: Outcome, now: datetime) -> None:
    """Rejected → failed; unknown → result_unknown and a look-up; retryable → authorized again
    after a backoff with the same key, until the capability's retry policy gives up."""
    details = {
        "error_name": outcome.error_name,
        "message": outcome.message,
        "http_status": outcome.http_status,
        "attempt_id": claim.attempt_id,
    }
    if outcome.kind == "rejected":
        tool_call_transition(call, "fail", actor=SYSTEM, producer="dispatcher", **details)
        return
    if outcome.kind == "unknown":
        tool_call_transition(call, "mark_unknown", actor=SYSTEM, producer="dispatcher", **details)
        outbox.enqueue(RECONCILE_TASK, call.pk, countdown=claim.capability.consistency_window)
        return
    policy = claim.capability.retry.get(outcome.error_name)
    failures = call.attempts.filter(error_name=outcome.error_name).count()
    if policy is None or failures >= policy.max_attempts:
        details["message"] = f"gave up after {failures} attempts: {outcome.message}"
        tool_call_transition(call, "fail", actor=SYSTEM, producer="dispatcher", **details)
        return
    delay = backoff(policy, failures, outcome.retry_after)
    call.next_attempt_at = now + timedelta(seconds=delay)
    gate.tool_call_authorize(
        call=call,
        actor=SYSTEM,
        producer="dispatcher",
        reason=f"retry after {outcome.error_name}: nothing was executed",
        delay_seconds=round(delay, 3),
        next_attempt_at=call.next_attempt_at.isoformat(),
        **details,
    )
