"""Reads for the approver console, always scoped to a tenant."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.db import connection
from django.db.models import (
    Case,
    Count,
    F,
    IntegerField,
    Max,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from approvals import sql
from approvals.models import Approval, ApprovalDecision
from runs.errors import not_found
from runs.models import Event, Tenant, User

RISK_ORDER = Case(
    When(risk="high", then=Value(0)),
    When(risk="medium", then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


def inbox(*, tenant: Tenant) -> QuerySet[Approval]:
    """Pending approvals, the soonest to expire first, riskier first among equals. Pages of it
    are read with LIMIT: the order starts with the index (tenant, state, expires_at), and the
    count of approvals so far is a subquery per row shown, not an aggregate over them all."""
    approved = (
        ApprovalDecision.objects.filter(approval=OuterRef("pk"))
        .exclude(decision=ApprovalDecision.Kind.REJECT)
        .order_by()
        .values("approval")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return (
        Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING)
        .select_related("run")
        .annotate(
            risk_rank=RISK_ORDER,
            approved_count=Coalesce(Subquery(approved), 0),
            # The console writes the summary from the capability's contract (money as money).
            capability_id=F("tool_call__capability_id"),
        )
        .order_by("expires_at", "risk_rank", "id")
    )


class InboxRow(NamedTuple):
    """What an inbox row shows of a pending approval (console/inbox_rows.py)."""

    id: str
    capability_id: str
    args: dict
    summary: str
    risk: str
    approvals_so_far: int
    required_approvers: int
    expires_at: datetime
    rule_name: str
    policy_version: int
    run_id: str
    run_title: str


def inbox_page(*, tenant: Tenant, offset: int, limit: int) -> list[InboxRow]:
    """`limit` rows of the inbox from `offset`, in inbox()'s order, read by written-out SQL on
    PostgreSQL (approvals/sql.py inbox_page), by inbox() elsewhere."""
    if connection.vendor != "postgresql":
        return inbox_page_orm(tenant=tenant, offset=offset, limit=limit)
    return [InboxRow(*row) for row in sql.inbox_page(tenant.pk, offset, limit)]


def inbox_page_orm(*, tenant: Tenant, offset: int, limit: int) -> list[InboxRow]:
    return [
        InboxRow(*(getattr(a, name) for name in InboxRow._fields[:-1]), run_title=a.run.title)
        for a in inbox(tenant=tenant)[offset : offset + limit]
    ]


@dataclass(frozen=True)
class InboxState:
    """What changes whenever the inbox does: an approval arrives or leaves (the count), or
    one is decided in part or changed (its updated_at)."""

    count: int
    latest: datetime | None

    def token(self, now: datetime) -> str:
        # The minute too: "time left" on the page moves with the clock.
        latest = self.latest.timestamp() if self.latest else 0
        return f"{self.count}-{latest:.6f}-{now:%Y%m%d%H%M}"


def inbox_state(*, tenant: Tenant) -> InboxState:
    """Written out (approvals/sql.py): every open inbox asks for it every 2 s, and the ORM's
    compiling of the aggregate cost more than its running (inbox_state_orm reads the same)."""
    return InboxState(*sql.inbox_state(tenant.pk))


def inbox_state_orm(*, tenant: Tenant) -> InboxState:
    # COUNT(*), not COUNT(id): the approval_changed index alone answers it (no table reads).
    figures = Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING).aggregate(
        count=Count("*"), latest=Max("updated_at")
    )
    return InboxState(figures["count"], figures["latest"])


def next_for(*, user: User, after: Approval) -> str | None:
    """The id of the next approval in the inbox's order that this person can still decide.
    Only the id: the page links to it, and without the inbox's annotations the query costs a
    fraction to build."""
    return (
        Approval.objects.filter(tenant=user.tenant, state=Approval.State.PENDING)
        .exclude(pk=after.pk)
        .exclude(decisions__user=user)
        .exclude(requested_by=user)
        .order_by("expires_at", RISK_ORDER, "id")
        .values_list("pk", flat=True)
        .first()
    )


def pending_count(*, tenant: Tenant) -> int:
    """The tenant's pending approvals; written out (approvals/sql.py): every page counts them."""
    return sql.pending_count(tenant.pk)


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
