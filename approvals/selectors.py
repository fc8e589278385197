"""Reads for the approver console, always scoped to a tenant."""

from __future__ import annotations

from django.db.models import Case, Count, IntegerField, Q, QuerySet, Value, When

from approvals.models import Approval
from runs.errors import not_found
from runs.models import Event, Tenant, User

RISK_ORDER = Case(
    When(risk="high", then=Value(0)),
    When(risk="medium", then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


def inbox(*, tenant: Tenant) -> QuerySet[Approval]:
    """Pending approvals, the soonest to expire first, riskier first among equals."""
    return (
        Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING)
        .select_related("tool_call", "run")
        .annotate(
            risk_rank=RISK_ORDER,
            # One query for the list, not one per row.
            approved_count=Count("decisions", filter=~Q(decisions__decision="reject")),
        )
        .order_by("expires_at", "risk_rank", "id")
    )


def next_for(*, user: User, after: Approval) -> Approval | None:
    """The next approval in the inbox's order that this person can still decide."""
    return (
        inbox(tenant=user.tenant)
        .exclude(pk=after.pk)
        .exclude(decisions__user=user)
        .exclude(requested_by=user)
        .first()
    )


def pending_count(*, tenant: Tenant) -> int:
    return Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING).count()


def approval_get(*, tenant: Tenant, approval_id: str) -> Approval:
    approval = (
        Approval.objects.select_related(
            "tool_call", "tool_call__decision", "run", "policy", "requested_by"
        )
        .filter(tenant=tenant, pk=approval_id)
        .first()
    )
    if approval is None:
        raise not_found("approval", approval_id)
    return approval


def approval_history(*, approval: Approval) -> QuerySet[Event]:
    """Everything logged about this approval's call: proposal, approvals, edits, dispatch."""
    return Event.objects.filter(run=approval.run, tool_call_id=approval.tool_call_id).order_by(
        "seq"
    )
