"""A run's lifecycle as its tool calls and approvals drive it: wait, resume, hand to a person,
stop, finish. Every change of a run's state outside `run_start` is made here, through
`runs.services.run_transition`, with the run row locked.

Runs live in the base app, which knows nothing of tool calls; the rules that depend on them
(a run waits while an approval is pending, goes on once no outcome is unknown) live here.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction

from approvals.models import Approval
from approvals.services import approval_transition
from runs import events, run_end
from runs.errors import RUN_INVALID_STATE, RUN_WORK_IN_FLIGHT, DomainError, not_found
from runs.models import Run, Tenant
from runs.services import run_transition
from toolcalls import channels, errors, sql, sql_decision
from toolcalls.models import ToolCall
from toolcalls.writes import tool_call_transition


def run_lock(run_id: str, *, tenant: Tenant | None = None) -> Run:
    # One hand-written statement (toolcalls/sql.py): the approve POST and the propose request
    # lock the run here, and compiling the ORM's query was most of the lock's CPU.
    run = sql.lock_run(tenant_id=tenant.pk if tenant else None, run_id=run_id)
    if run is None:
        raise not_found("run", run_id)
    return run


def run_wait_for_approval(*, run_id: str, approval_id: str, actor: str, producer: str) -> None:
    run = run_lock(run_id)
    if run.state == Run.State.ACTIVE:
        run_transition(
            run, "wait", actor=actor, producer=producer, reason=f"{approval_id} waits for approval"
        )


def run_hand_to_human(*, run_id: str, actor: str, producer: str, reason: str) -> Run | None:
    """The run waits for a person; returns it, or None when it was not active or waiting."""
    run = run_lock(run_id)
    if run.state not in (Run.State.ACTIVE, Run.State.WAITING):
        return None
    return run_transition(run, "hand_to_human", actor=actor, producer=producer, reason=reason)


def run_resume_if_unblocked(
    *, run_id: str, actor: str, producer: str, known: tuple[Run, bool] | None = None
) -> None:
    """The one rule for going on by itself: a waiting run resumes once no approval of it is
    pending; a run handed to a person resumes once none of its outcomes is unknown. `known`:
    the run as this transaction locked it and whether an approval of it is pending, when the
    caller read both after the lock (a decision: toolcalls/gate.py); then nothing is read."""
    run, pending = (known[0], lambda: known[1]) if known else _run_and_pending(run_id)
    if run.state == Run.State.WAITING:
        if pending():
            return
        run_transition(run, "resume", actor=actor, producer=producer, reason="no approval pending")
    elif run.state == Run.State.NEEDS_HUMAN:
        if ToolCall.objects.filter(run=run, execution_status__in=ToolCall.UNKNOWN).exists():
            return
        run_transition(
            run,
            "resume",
            actor=actor,
            producer=producer,
            reason="every unknown outcome is resolved",
        )


def decided_run(approval: Approval, call: ToolCall) -> tuple[Run, bool] | None:
    """For a decision's resume: (the run, whether another approval of it is pending) when the
    decision read both with the run locked — the run by its lock statement (sql_decision.
    lock_for_decision: as it is once the lock was granted; nothing in the decision writes it),
    the question by its decision's statement (approvals/sql.py record_decision, which starts
    after that lock). Between that statement and the resume the decision changes no other
    approval of the run. None: `run_resume_if_unblocked` asks after the lock itself."""
    pending = approval.__dict__.get("others_pending_in_run")
    run = ToolCall.run.field.get_cached_value(call, default=None)
    if pending is None or run is None or not events.batch_holds_run(call.run_id):
        return None
    return run, pending


def _run_and_pending(run_id: str) -> tuple[Run, Callable[[], bool]]:
    """The run locked, and "is an approval of it still pending?" to ask if it waits. A decision
    holds the run's lock already (its events' batch took it): one statement answers both
    (toolcalls/sql_decision.py). Otherwise the question is asked after the lock, a statement
    apart, so that it sees a decision that committed while this one waited for the lock."""
    if connection.vendor == "postgresql" and events.batch_holds_run(run_id):
        found = sql_decision.held_run_and_pending(run_id)
        if found is None:
            raise not_found("run", run_id)
        run, pending = found
        return run, lambda: pending
    run = run_lock(run_id)
    return run, lambda: sql.approval_pending_in_run(run.pk)


def run_resume_by_person(*, tenant: Tenant, run_id: str, actor: str, reason: str) -> Run:
    """A person carries on with a run handed to them (an approval expired, say): only once
    nothing in it is unknown."""
    with transaction.atomic():
        run = run_lock(run_id, tenant=tenant)
        if ToolCall.objects.filter(run=run, execution_status__in=ToolCall.UNKNOWN).exists():
            raise DomainError(errors.DESK_UNKNOWNS_LEFT, "Resolve its unknown calls first.")
        return run_transition(
            run, "resume", actor=actor, producer="desk", reason=reason or "resumed from the desk"
        )


def tool_call_cancel(*, call: ToolCall, actor: str, producer: str, reason: str) -> None:
    """Cancel a call not yet sent, and the approval that holds it, so nobody is asked to
    approve what can no longer run. The call is locked."""
    for approval in call.approvals.select_for_update().filter(state__in=Approval.OPEN_STATES):
        approval_transition(approval, "cancel", actor=actor, producer=producer, reason=reason)
    tool_call_transition(call, "cancel", actor=actor, producer=producer, reason=reason)


def run_cancel_open_calls(
    *, run: Run, actor: str, reason: str, producer: str = "api"
) -> list[ToolCall]:
    """Cancel what is not yet sent; return the calls still in flight. The run is locked."""
    in_flight = []
    for call in ToolCall.objects.select_for_update().filter(run=run).select_related("run"):
        if call.execution_status in ToolCall.NOT_SENT:
            tool_call_cancel(call=call, actor=actor, producer=producer, reason=reason)
        elif call.execution_status in ToolCall.IN_FLIGHT:
            in_flight.append(call)
    return in_flight


@run_end.register
def run_end_close_open_work(*, run: Run, actor: str, producer: str, reason: str) -> None:
    """At every terminal exit: the calls not yet sent are cancelled with their approvals, and
    an approval still open without such a call is cancelled too, so no approver is left with
    a request that can never run. `run_stop` has usually done this already (nothing left)."""
    run_cancel_open_calls(run=run, actor=actor, reason=reason, producer=producer)
    open_approvals = Approval.objects.select_for_update().filter(
        run=run, state__in=Approval.OPEN_STATES
    )
    for approval in open_approvals.select_related("run"):
        approval_transition(approval, "cancel", actor=actor, producer=producer, reason=reason)


@transaction.atomic
def run_stop(*, tenant: Tenant, run_id: str, actor: str, reason: str = "") -> tuple[Run, list]:
    """Cancel the run and every call not yet sent (with its pending approval); report the
    calls still in flight (their outcome is still recorded when it comes; it does not reopen
    the run)."""
    run = run_lock(run_id, tenant=tenant)
    in_flight = run_cancel_open_calls(run=run, actor=actor, reason=reason or "run stopped")
    if run.state != Run.State.CANCELLED:
        run_transition(run, "cancel", actor=actor, reason=reason, producer="api")
    return run, in_flight


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
    run = run_lock(run_id, tenant=tenant)
    if run.state not in (Run.State.ACTIVE, Run.State.WAITING):
        raise DomainError(RUN_INVALID_STATE, f"Run {run.pk} is {run.state} already.")
    calls = list(ToolCall.objects.filter(run=run))
    moving = [c for c in calls if c.is_on_its_way]
    if moving:
        raise DomainError(
            RUN_WORK_IN_FLIGHT,
            f"{', '.join(c.pk for c in moving)} still on their way: wait for them, or stop "
            "the run (POST /stop) to cancel what is not dispatched.",
            details=[
                {"tool_call_id": c.pk, "execution_status": c.execution_status} for c in moving
            ],
        )
    unknown = [c for c in calls if c.is_unknown]
    degraded = [c for c in calls if c.did_not_succeed]
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
    run = run_transition(run, action, actor=actor, producer="api", reason=reason)
    if action == "hand_to_human":
        channels.desk_run_added(run, reason=reason)
    return run
