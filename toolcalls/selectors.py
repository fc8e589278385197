"""Reads of tool calls, always scoped to a tenant."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Prefetch, Q, QuerySet, prefetch_related_objects

from runs.errors import not_found
from runs.models import Event, Run, Tenant
from toolcalls import sql, sql_pages
from toolcalls.models import E, ToolCall, WebhookDelivery


def tool_call_get(*, tenant: Tenant, tool_call_id: str) -> ToolCall:
    call = ToolCall.objects.filter(tenant=tenant, pk=tool_call_id).first()
    if call is None:
        raise not_found("tool call", tool_call_id)
    return call


def run_tool_calls(*, run: Run) -> QuerySet[ToolCall]:
    return (
        ToolCall.objects.filter(run=run)
        .prefetch_related("attempts", "receipts", "depends_on")
        .order_by("id")
    )


# What the run page and its progress contract read of each call: loading the whole row also
# copies its JSON documents for `changed_fields`, which a page that writes nothing never uses.
PAGE_FIELDS = (
    "id",
    "run_id",
    "capability_id",
    "intent",
    "args",
    "idempotency_key",
    "execution_status",
    "verification_status",
    "external_id",
    "last_error_name",
)


def run_tool_calls_for_page(*, run: Run) -> list[ToolCall]:
    """The run's calls for its console page, oldest first. Only an authorized call waits on
    its dependencies (toolcalls.progress), so only those have them read: the M2M prefetch
    costs a query and its compilation even when it finds nothing."""
    calls = list(ToolCall.objects.filter(run=run).only(*PAGE_FIELDS).order_by("id"))
    authorized = [call for call in calls if call.execution_status == E.AUTHORIZED]
    prefetch_related_objects(
        authorized,
        Prefetch("depends_on", queryset=ToolCall.objects.only("id", "verification_status")),
    )
    return calls


def call_steps(*, calls: list[ToolCall]) -> dict[str, dict[str, list[tuple]]]:
    """The attempts (number, classification, error) and receipts (external id, status,
    source) of `calls`, by call id: plain values for the run page's table, in one statement
    (toolcalls/sql.py)."""
    return sql.call_steps([call.pk for call in calls])


def calls_effect_pending(
    *, tenant: Tenant, capability_id: str, object_ref: str, exclude: str | None = None
) -> QuerySet[ToolCall]:
    """The tenant's calls of one capability on one object whose effect may not show at the
    external system yet: not final, or completed and not yet confirmed there. Oldest first;
    `exclude` is the call asking."""
    calls = ToolCall.objects.filter(
        Q(execution_status__in=ToolCall.EFFECT_PENDING)
        | Q(execution_status=E.COMPLETED, verification_status__in=ToolCall.UNCONFIRMED),
        tenant=tenant,
        capability_id=capability_id,
        object_ref=object_ref,
    )
    if exclude:
        calls = calls.exclude(pk=exclude)
    return calls.order_by("created_at", "id")


def webhook_deliveries(*, tenant: Tenant, limit: int = 100) -> list[WebhookDelivery]:
    """The tenant's latest webhook deliveries, newest first, each with its attempts."""
    return list(
        WebhookDelivery.objects.filter(tenant=tenant)
        .select_related("webhook")
        .prefetch_related("attempt_log")
        .order_by("-created_at")[:limit]
    )


def proposed_args_digest(*, call: ToolCall) -> str:
    """The digest of the arguments the call was proposed with (an approver's edit replaces
    `args_digest`; its `tool_call.proposed` event keeps the first)."""
    return (
        Event.objects.filter(tool_call_id=call.pk, event_type="tool_call.proposed")
        .values_list("payload__args_digest", flat=True)
        .first()
        or ""
    )


def calls_on_object(
    *,
    tenant: Tenant,
    object_ref: str,
    since: datetime,
    capability_id: str | None = None,
    exclude: str | None = None,
    limit: int = 20,
) -> list[ToolCall]:
    """The tenant's other calls on one object (of one capability, when named) that are still
    open, or that changed since `since`: what an approver should see before approving the
    same thing twice. Newest first; one query on the toolcall_obj index, written out on
    PostgreSQL (toolcalls/sql.py)."""
    if connection.vendor == "postgresql":
        return sql_pages.calls_on_object(
            tenant.pk, object_ref, since, capability_id, exclude, limit
        )
    return calls_on_object_orm(
        tenant=tenant,
        object_ref=object_ref,
        since=since,
        capability_id=capability_id,
        exclude=exclude,
        limit=limit,
    )


def calls_on_object_orm(
    *,
    tenant: Tenant,
    object_ref: str,
    since: datetime,
    capability_id: str | None = None,
    exclude: str | None = None,
    limit: int = 20,
) -> list[ToolCall]:
    calls = ToolCall.objects.filter(tenant=tenant, object_ref=object_ref).filter(
        ~Q(execution_status__in=ToolCall.FINAL_EXECUTION) | Q(updated_at__gte=since)
    )
    if capability_id:
        calls = calls.filter(capability_id=capability_id)
    if exclude:
        calls = calls.exclude(pk=exclude)
    return list(calls.order_by("-created_at", "-id")[:limit])
