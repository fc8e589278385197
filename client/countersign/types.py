"""What the API answers, typed. They are TypedDicts: plain dicts at run time (`call["status"]`),
checked by a type checker. The fields are those of the OpenAPI document at /api/v1/openapi.json.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

Status = Literal[
    "awaiting_approval",
    "running",
    "succeeded",
    "failed",
    "rejected",
    "expired",
    "cancelled",
    "unknown",
]

# The statuses that no longer change by themselves. `unknown` is not one: Countersign is
# looking the outcome up (or a person owns it) — never send the call again.
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "rejected", "expired", "cancelled"})


class Run(TypedDict):
    run_id: str
    title: str
    state: str
    correlation_id: str
    external_ref: str | None
    max_tool_calls: int
    max_attempts: int
    deadline: str | None
    metadata: dict[str, Any]
    created_at: str
    updated_at: str


class Decision(TypedDict):
    decision_id: str
    run_id: str
    kind: str
    version: int
    content: dict[str, Any]
    supersedes: str | None
    created_at: str


class DecisionEntry(TypedDict):
    user: str
    decision: str  # approve, reject, approve_with_edits
    reason: str
    changes: dict[str, Any] | None  # {"field": {"from": old, "to": new}}
    at: str


class PeopleDecision(TypedDict):
    """What people decided: outcome, who (usernames) and why."""

    outcome: str  # approved, rejected, pending, expired, invalidated, cancelled
    by: list[str]
    reason: str
    decided_at: str
    decisions: list[DecisionEntry]


class Approval(TypedDict):
    approval_id: str
    state: str
    required_approvers: int
    approvals: int
    rule: str
    policy_version: int
    expires_at: str


class ErrorSummary(TypedDict):
    name: str
    message: str


class ToolCall(TypedDict):
    """The result envelope (`status` … `retry_after_s`), then the call's own fields."""

    tool_call_id: str
    run_id: str
    capability: str
    status: Status
    result: dict[str, Any] | None
    executed_args: dict[str, Any]
    edited: bool
    decision: PeopleDecision | None
    approval_url: str | None
    expires_at: str | None
    retry_after_s: int | None
    args: dict[str, Any]
    args_digest: str
    intent: str
    object: dict[str, Any]
    decision_id: str | None
    idempotency_key: str
    external_request_id: str
    execution_status: str
    verification_status: str
    approval: Approval | None
    external_id: str
    raw_result: dict[str, Any] | None
    last_error: ErrorSummary | None
    attempts: int
    fencing_token: int
    depends_on: list[str]
    compensation_of: str | None
    compensation: str | None
    created_at: str
    updated_at: str


class PolicyEvaluation(TypedDict):
    capability: str
    needs_approval: bool
    rule: str | None
    required_approvers: int
    risk: str
    policy_version: int
    expiry_seconds: int | None
    expires_at: str | None
    on_expiry: str | None
    summary: str


def is_terminal(call: ToolCall) -> bool:
    return call["status"] in TERMINAL
