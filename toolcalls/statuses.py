"""A tool call's statuses: its two machines' states and the one word an agent acts on.

Kept apart from toolcalls/models.py (which imports and re-exports them) so that module stays
within its size; `from toolcalls.models import E` keeps working.
"""

from __future__ import annotations

from django.db import models


class Execution(models.TextChoices):
    PROPOSED = "proposed"
    AWAITING_APPROVAL = "awaiting_approval"
    AUTHORIZED = "authorized"
    DISPATCHING = "dispatching"
    ACCEPTED = "accepted"
    COMPLETED = "completed"
    FAILED = "failed"
    RESULT_UNKNOWN = "result_unknown"
    NEEDS_HUMAN = "needs_human"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"
    CANCELLED = "cancelled"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"


class Verification(models.TextChoices):
    NOT_OBSERVED = "not_observed"
    PENDING = "pending"
    CONFIRMED_SUCCESS = "confirmed_success"
    CONFIRMED_FAILURE = "confirmed_failure"
    INCONCLUSIVE = "inconclusive"


class AgentStatus(models.TextChoices):
    """What an agent acts on, in one word: the `status` of every tool-call answer and webhook.
    `ToolCall.agent_status` is the one mapping from the two machines (docs/agent-api.md, "The
    result envelope")."""

    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


# The statuses that no longer change by themselves (`tool_call.terminal` webhooks). `unknown`
# is not one: reconciliation or a person still settles it.
TERMINAL_STATUSES = frozenset(
    {
        AgentStatus.SUCCEEDED,
        AgentStatus.FAILED,
        AgentStatus.REJECTED,
        AgentStatus.EXPIRED,
        AgentStatus.CANCELLED,
    }
)

E = Execution
V = Verification
S = AgentStatus
# What the unknowns desk may show (dispatches only once their lease expired).
DESK_STATUSES = (E.RESULT_UNKNOWN, E.NEEDS_HUMAN, E.DISPATCHING)
