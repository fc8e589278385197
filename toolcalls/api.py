"""Agent API for capabilities and tool calls, and for the run's lifecycle as its calls decide
it (stop, complete, progress: `run_router`, tagged "runs")."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema, Status
from pydantic import field_validator

from runs import selectors as run_selectors
from runs.api import ERRORS, RunOut, StrictSchema, iso_time_only, run_out
from runs.services import actor_for_key
from toolcalls import capabilities, commands, lifecycle, propose, selectors
from toolcalls.envelope import new_call_relations, tool_call_out
from toolcalls.models import AgentStatus
from toolcalls.progress import progress

router = Router(tags=["tool calls"])
run_router = Router(tags=["runs"])

# Long-polling holds a web thread; keep the wait short and bounded.
MAX_WAIT_SECONDS = 30


class ObjectIn(StrictSchema):
    ref: str = Field("", max_length=200)
    revision: int | None = Field(None, ge=0)


class ToolCallIn(StrictSchema):
    capability: str = Field(..., min_length=1, max_length=100)
    args: dict[str, Any]
    intent: str = Field(..., min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    decision_id: str | None = Field(None, max_length=40)
    object: ObjectIn | None = None
    # Earlier calls of this run that must be confirmed_success before this one is sent.
    depends_on: list[str] = Field(default_factory=list, max_length=50)


class ObjectOut(Schema):
    ref: str
    revision: int | None


class ErrorSummary(Schema):
    name: str
    message: str


class DecisionEntryOut(Schema):
    user: str
    decision: str
    reason: str
    # {"field": {"from": old, "to": new}} when this person edited the arguments.
    changes: dict[str, Any] | None
    at: datetime


class ApprovalDecisionOut(Schema):
    """What people decided on the call's latest decided approval."""

    outcome: str = Field(
        ...,
        description="approved (an approver's edit that needs nobody else counts), rejected, "
        "pending (a quorum not reached yet), expired, invalidated or cancelled",
    )
    by: list[str] = Field(..., description="usernames, in the order they decided")
    reason: str
    decided_at: datetime
    decisions: list[DecisionEntryOut]


class ApprovalOut(Schema):
    approval_id: str
    state: str
    required_approvers: int
    approvals: int
    rule: str
    policy_version: int
    expires_at: datetime


class ToolCallOut(Schema):
    """The result envelope (docs/agent-api.md), then the call's own fields."""

    tool_call_id: str
    run_id: str
    capability: str
    status: AgentStatus = Field(
        ...,
        description="What to act on. awaiting_approval: a person decides (see approval_url); "
        "running: proposed, authorized, dispatching, or sent and being verified; succeeded: "
        "verification confirmed the effect; failed: it did not happen (or verification "
        "confirmed it failed); rejected, expired: the approval said no or ran out; "
        "cancelled: stopped before dispatch (also invalidated: the object or arguments "
        "changed, propose again); unknown: the outcome is being looked up or a person owns "
        "it — do not retry.",
    )
    result: dict[str, Any] | None = Field(
        ..., description="The receipt's business fields (raw_result has the receipt verbatim)"
    )
    executed_args: dict[str, Any] = Field(
        ...,
        description="The arguments Countersign sends (or sent): an approver's edits included; "
        "the proposed ones are in the tool_call.proposed event",
    )
    edited: bool = Field(..., description="An approver changed the arguments")
    decision: ApprovalDecisionOut | None
    approval_url: str | None = Field(
        ..., description="The approval page of the latest approval (COUNTERSIGN_BASE_URL)"
    )
    expires_at: datetime | None = Field(
        ..., description="When its open approval expires (the policy's on_expiry follows)"
    )
    retry_after_s: int | None = Field(
        ...,
        description="Seconds before polling again; null when the status will not change by "
        "itself. GET ?wait= answers as soon as it changes.",
    )
    args: dict[str, Any]
    args_digest: str
    intent: str
    object: ObjectOut
    decision_id: str | None
    idempotency_key: str
    external_request_id: str
    execution_status: str
    verification_status: str
    approval: ApprovalOut | None
    external_id: str
    raw_result: dict[str, Any] | None
    last_error: ErrorSummary | None
    attempts: int
    fencing_token: int
    depends_on: list[str]
    compensation_of: str | None
    compensation: str | None
    created_at: datetime
    updated_at: datetime


class CapabilityOut(Schema):
    id: str
    version: int
    title: str
    system: str
    kind: str
    permission: str
    risk: str
    reversible: bool
    irreversible: bool
    compensation: str | None
    lookup: bool
    consistency_window_seconds: float
    remote_dedupe_window_seconds: float | None
    timeout_seconds: float
    retry: dict[str, dict[str, float]]
    input_schema: dict[str, Any]
    # Whether this key's scopes cover the capability: a key lists what it may propose (an
    # MCP server offers those as its tools); proposing one it may not is 403.
    may_propose: bool


class WaitQuery(Schema):
    wait: float = Field(0, ge=0, le=MAX_WAIT_SECONDS)
    # The `updated_at` the caller last saw: a call that changed since answers at once.
    since: datetime | None = None

    _since_is_iso = field_validator("since", mode="before")(iso_time_only)


@router.get("/capabilities", response={200: list[CapabilityOut], **ERRORS})
def list_capabilities(request: HttpRequest) -> list[dict[str, Any]]:
    """Every contract: what it does, its risk and input schema (with a valid example), and
    whether this API key may propose it (`may_propose`)."""
    key = request.auth
    return [
        {
            **capability.describe(),
            "may_propose": key.may_propose(
                capability_id=capability.id, permission=capability.permission
            ),
        }
        for capability in capabilities.REGISTRY.values()
    ]


@router.post("/runs/{run_id}/tool-calls", response={200: ToolCallOut, 201: ToolCallOut, **ERRORS})
def propose_tool_call(
    request: HttpRequest, run_id: str, payload: ToolCallIn, response: HttpResponse
) -> Status:
    """Propose a side effect. The same intent on the same object with the same args answers
    200 with the existing call; with other args, 409 `idempotency.conflict`. The key's scopes
    must cover the capability (its id, its permission, the permission's group or `*`), or
    403 `auth.scope_missing`."""
    call, created = propose.tool_call_propose(
        tenant=request.auth.tenant,
        run_id=run_id,
        capability_id=payload.capability,
        args=payload.args,
        intent=payload.intent,
        decision_id=payload.decision_id,
        object_ref=payload.object.ref if payload.object else "",
        object_revision=payload.object.revision if payload.object else None,
        actor=actor_for_key(request.auth),
        requested_by=request.auth.principal,
        depends_on=payload.depends_on,
        api_key=request.auth,  # its scopes must cover the capability (403 auth.scope_missing)
    )
    if not created:
        response["Idempotent-Replayed"] = "true"
        return Status(200, tool_call_out(call))
    return Status(201, tool_call_out(call, new_call_relations(call, payload.depends_on or [])))


@router.get("/tool-calls/{tool_call_id}", response={200: ToolCallOut, **ERRORS})
def get_tool_call(
    request: HttpRequest, tool_call_id: str, query: Query[WaitQuery]
) -> dict[str, Any]:
    """Read a call. With `?wait=N` (seconds, at most 30) answer as soon as it changes (after
    `since`, the `updated_at` you last saw, when given); a settled call answers at once."""
    call = selectors.tool_call_get(tenant=request.auth.tenant, tool_call_id=tool_call_id)
    deadline = time.monotonic() + query.wait
    seen = to_the_millisecond(query.since or call.updated_at)
    if to_the_millisecond(call.updated_at) != seen or call.is_settled:
        return tool_call_out(call)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        call = selectors.tool_call_get(tenant=request.auth.tenant, tool_call_id=tool_call_id)
        if to_the_millisecond(call.updated_at) != seen:
            break
    return tool_call_out(call)


def to_the_millisecond(moment: datetime) -> datetime:
    """Answers write times to the millisecond (DjangoJSONEncoder), so a `since` the agent
    copied from one is compared at that precision."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


class CancelIn(StrictSchema):
    reason: str = Field("", max_length=2000)


@router.post("/tool-calls/{tool_call_id}/cancel", response={200: ToolCallOut, **ERRORS})
def cancel_tool_call(
    request: HttpRequest, tool_call_id: str, payload: CancelIn | None = None
) -> dict[str, Any]:
    """Cancel a call before it is dispatched (awaiting approval or authorized), with its open
    approval; asking again answers the same. Once dispatched: 409
    `tool_call.already_dispatched`, naming its state (its outcome is still recorded); a call
    that ended unsent (rejected, expired …): 409 `tool_call.invalid_state`."""
    call = commands.tool_call_cancel_before_dispatch(
        tenant=request.auth.tenant,
        tool_call_id=tool_call_id,
        actor=actor_for_key(request.auth),
        reason=payload.reason if payload else "",
    )
    return tool_call_out(call)


class PolicyEvaluationIn(StrictSchema):
    capability: str = Field(..., min_length=1, max_length=100)
    args: dict[str, Any]


class PolicyEvaluationOut(Schema):
    capability: str
    needs_approval: bool
    rule: str | None = Field(..., description="The policy rule that asks; null when none does")
    required_approvers: int
    risk: str
    policy_version: int
    expiry_seconds: int | None
    expires_at: datetime | None = Field(
        ..., description="When the approval would expire if the call were proposed now"
    )
    on_expiry: str | None = Field(..., description="cancel, or hand_to_human (the run)")
    summary: str = Field(..., description="What an approver would be shown")


@router.post("/policy/evaluate", response={200: PolicyEvaluationOut, **ERRORS})
def evaluate_policy(request: HttpRequest, payload: PolicyEvaluationIn) -> dict[str, Any]:
    """A dry run: would a call of this capability with these arguments need approval now, by
    which rule, from how many people, expiring when? Writes nothing; the arguments are checked
    against the capability's schema (422 `tool.validation_failed`), not against the external
    system (a proposal does that)."""
    return propose.tool_call_evaluate_policy(
        tenant=request.auth.tenant, capability_id=payload.capability, args=payload.args
    )


@router.post("/tool-calls/{tool_call_id}/retry", response={202: ToolCallOut, **ERRORS})
def retry_tool_call(request: HttpRequest, tool_call_id: str) -> Status:
    """Send a call that failed without executing again, with the same idempotency key. The
    key needs a scope for the call's capability."""
    call = commands.tool_call_retry(
        tenant=request.auth.tenant,
        tool_call_id=tool_call_id,
        actor=actor_for_key(request.auth),
        api_key=request.auth,
    )
    return Status(202, tool_call_out(call))


@router.post("/tool-calls/{tool_call_id}/reconcile", response={202: ToolCallOut, **ERRORS})
def reconcile_tool_call(request: HttpRequest, tool_call_id: str) -> Status:
    """Look an unknown outcome up at the external system now."""
    call = commands.tool_call_reconcile_now(
        tenant=request.auth.tenant, tool_call_id=tool_call_id, actor=actor_for_key(request.auth)
    )
    return Status(202, tool_call_out(call))


@router.post(
    "/tool-calls/{tool_call_id}/compensate", response={200: ToolCallOut, 201: ToolCallOut, **ERRORS}
)
def compensate_tool_call(request: HttpRequest, tool_call_id: str) -> Status:
    """Undo a confirmed call with its compensating capability; asking twice answers 200 with
    the same compensating call. The key needs a scope for the compensating capability."""
    call, created = commands.tool_call_compensate(
        tenant=request.auth.tenant,
        tool_call_id=tool_call_id,
        actor=actor_for_key(request.auth),
        api_key=request.auth,
    )
    return Status(201 if created else 200, tool_call_out(call))


# --- the run, as its calls decide it -----------------------------------------------------


class StopIn(StrictSchema):
    reason: str = Field("", max_length=2000)


class FinishIn(StrictSchema):
    failed_permanently: bool = False
    reason: str = Field("", max_length=2000)


class InFlightOut(Schema):
    tool_call_id: str
    execution_status: str


class StopOut(RunOut):
    in_flight: list[InFlightOut]


@run_router.post("/runs/{run_id}/stop", response={200: StopOut, **ERRORS})
def stop_run(request: HttpRequest, run_id: str, payload: StopIn | None = None) -> dict[str, Any]:
    """Cancel the run and its calls not yet dispatched; `in_flight` lists the calls whose
    outcome is still coming. Stopping a cancelled run again answers the same."""
    run, in_flight = lifecycle.run_stop(
        tenant=request.auth.tenant,
        run_id=run_id,
        reason=payload.reason if payload else "",
        actor=actor_for_key(request.auth),
    )
    return {
        **run_out(run),
        "in_flight": [
            {"tool_call_id": c.pk, "execution_status": c.execution_status} for c in in_flight
        ],
    }


@run_router.post("/runs/{run_id}/complete", response={200: RunOut, **ERRORS})
def finish_run(request: HttpRequest, run_id: str, payload: FinishIn | None = None) -> dict:
    """End the run. Its exit type comes from its calls: `completed`,
    `completed_with_degradation`, `needs_human`, or `failed_permanently` when you say so."""
    run = lifecycle.run_finish(
        tenant=request.auth.tenant,
        run_id=run_id,
        failed_permanently=payload.failed_permanently if payload else False,
        reason=payload.reason if payload else "",
        actor=actor_for_key(request.auth),
    )
    return run_out(run)


@run_router.get("/runs/{run_id}/progress", response={200: dict[str, Any], **ERRORS})
def run_progress(request: HttpRequest, run_id: str) -> dict[str, Any]:
    """The progress contract: verified items, open items, failed items and the next safe
    step, derived from stored state (the run page shows the same)."""
    return progress(run_selectors.run_get(tenant=request.auth.tenant, run_id=run_id))
