"""The error names of tool calls (DESIGN section 7): stable, dotted, each with what it means.

They decide what happens next (retry, look up, fail, ask a person), appear in events, API
answers and pages, and are what a capability's retry policy is keyed by."""

from __future__ import annotations

# From the external system, classified by dispatch (toolcalls/dispatch.py).
VALIDATION_FAILED = "tool.validation_failed"  # arguments refused, by our contract or theirs
AUTH_FAILED = "tool.auth_failed"  # the system refused our credentials
REJECTED = "tool.rejected"  # the system refused the operation (404, 409, 422)
RATE_LIMITED = "tool.rate_limited"  # 429: nothing executed, retried after Retry-After
UPSTREAM_5XX = "tool.upstream_5xx"  # 502/503 retried; 500/504 may have executed: unknown
UNREACHABLE = "tool.unreachable"  # the connection never opened: nothing was sent
TIMEOUT = "tool.timeout"  # sent, no answer in time: unknown
CONNECTION_LOST = "tool.connection_lost"  # sent, then the connection broke: unknown
LEASE_EXPIRED = "tool.lease_expired"  # the worker died or hung mid-call: unknown
CHECK_UNAVAILABLE = "tool.check_unavailable"  # the business check could not read the system

# Look-ups of an unknown outcome (toolcalls/reconcile.py). None of them proves anything.
NO_LOOKUP = "tool.no_lookup"  # the capability has no way to look an operation up
LOOKUP_UNREACHABLE = "tool.lookup_unreachable"  # the look-up request failed in transport
LOOKUP_FAILED = "tool.lookup_failed"  # the system answered the look-up with an error

# A person's resolution on the unknowns desk.
DID_NOT_HAPPEN = "tool.did_not_happen"  # established that it never executed
ABANDONED = "tool.abandoned"  # a person gave up on the operation

# Refusals before sending, and of the run's budgets.
PRECONDITION_CONFLICT = "precondition.conflict"  # the object moved on, or has another writer
BUDGET_EXCEEDED = "flow.budget_exceeded"  # the run used its attempts
DEADLINE_EXCEEDED = "flow.deadline_exceeded"  # the run passed its deadline
MAX_STEPS_EXCEEDED = "flow.max_steps_exceeded"  # the run used its tool calls
CIRCUIT_OPEN = "flow.circuit_open"  # the capability's breaker is open: the call waits
CAPABILITY_UNKNOWN = "capability.unknown"  # a call whose contract is no longer registered

# Commands refused in the call's current state.
INVALID_STATE = "tool_call.invalid_state"
OUTCOME_UNKNOWN = "tool_call.outcome_unknown"  # retry refused: it may have happened
NOT_RETRYABLE = "tool_call.not_retryable"
NOT_UNKNOWN = "tool_call.not_unknown"  # look-up asked for an outcome that is known
ALREADY_DISPATCHED = "tool_call.already_dispatched"  # cancel refused: it was sent already
COMPENSATION_NOT_AVAILABLE = "compensation.not_available"
COMPENSATION_NOT_CONFIRMED = "compensation.not_confirmed"

# The unknowns desk (toolcalls/commands.py, console pages).
DESK_FORBIDDEN = "desk.forbidden"
DESK_NOT_UNKNOWN = "desk.not_unknown"
DESK_LOOKUP_FAILED = "desk.lookup_failed"
DESK_NOT_FOUND_AT_SYSTEM = "desk.not_found_at_system"
DESK_ID_MISMATCH = "desk.id_mismatch"
DESK_EXTERNAL_ID_REQUIRED = "desk.external_id_required"
DESK_EVIDENCE_REQUIRED = "desk.evidence_required"
DESK_REASON_REQUIRED = "desk.reason_required"
DESK_IT_HAPPENED = "desk.it_happened"
DESK_TOO_EARLY = "desk.too_early"
DESK_UNKNOWNS_LEFT = "desk.unknowns_left"
CHANNEL_INVALID = "channel.invalid"  # a chat channel's URL or events it cannot take

# Errors that prove the operation was not executed: a person may send it again.
NOT_EXECUTED = frozenset(
    {
        RATE_LIMITED,
        UPSTREAM_5XX,
        UNREACHABLE,
        BUDGET_EXCEEDED,
        DEADLINE_EXCEEDED,
        DID_NOT_HAPPEN,
        CAPABILITY_UNKNOWN,
    }
)
