"""The unknowns desk for admins: the list, one item's handoff packet, and one small POST view
per command (look up, mark confirmed, mark not happened, retry, compensate, abandon, resume)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import redirect, render
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from console import desk, sql
from runs.errors import DomainError
from runs.models import User
from runs.permissions import tenant_admin_required
from runs.services import actor_for_user
from toolcalls import commands
from toolcalls.models import ToolCall

DESK_ROWS = 100


@tenant_admin_required
def desk_list(request: HttpRequest) -> HttpResponse:
    # The longest waits, and how many more: a page of thousands of rows (an outage) helps
    # nobody, and their HTML was most of the page's time.
    items = desk.desk_items(tenant=request.user.tenant, limit=DESK_ROWS)
    counts = desk.desk_counts(tenant=request.user.tenant)
    template = "toolcalls/desk.html#desk-rows" if request.htmx else "toolcalls/desk.html"
    context = {
        "items": items,
        "rows": mark_safe(  # every value in them escaped by desk_rows
            desk.desk_rows(items, user_id=request.user.pk, csrf_input=_csrf_input(request))
        ),
        "more": max(0, counts.items - len(items)),
        "systems": counts.systems,
    }
    return render(request, template, context)


def _csrf_input(request: HttpRequest) -> str:
    # What {% csrf_token %} writes.
    return format_html(
        '<input type="hidden" name="csrfmiddlewaretoken" value="{}">', get_token(request)
    )


def _call(request: HttpRequest, tool_call_id: str) -> ToolCall:
    if connection.vendor == "postgresql":
        call = sql.desk_call(tenant_id=request.user.tenant_id, tool_call_id=tool_call_id)
    else:
        call = (
            ToolCall.objects.select_related("run", "decision", "tenant")
            .filter(tenant=request.user.tenant, pk=tool_call_id)
            .first()
        )
    if call is None:
        raise Http404("No such tool call.")
    return call


@tenant_admin_required
def desk_item(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    packet = desk.handoff(_call(request, tool_call_id))
    template = (
        "toolcalls/desk_item.html#packet-status" if request.htmx else "toolcalls/desk_item.html"
    )
    return render(request, template, packet)


def _run_command(
    request: HttpRequest, tool_call_id: str, command: Callable[[ToolCall, User], str]
) -> HttpResponse:
    """Run one desk command; its refusal is shown on the item's page as it is now."""
    call = _call(request, tool_call_id)
    try:
        messages.success(request, command(call, request.user))
    except DomainError as exc:
        packet = desk.handoff(_call(request, tool_call_id))
        return render(
            request, "toolcalls/desk_item.html", {**packet, "refusal": exc}, status=exc.status
        )
    return redirect("desk:item", call.pk)


def _evidence(request: HttpRequest) -> str:
    return request.POST.get("evidence", "").strip()


@require_POST
@tenant_admin_required
def look_up(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        commands.desk_look_up(tenant=user.tenant, tool_call_id=call.pk, user=user)
        return "Looking it up now; this page shows the result."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def mark_confirmed(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        commands.desk_mark_confirmed(
            tenant=user.tenant,
            tool_call_id=call.pk,
            user=user,
            external_id=request.POST.get("external_id", ""),
            evidence=_evidence(request),
        )
        return "Marked confirmed."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def mark_not_happened(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        commands.desk_mark_not_happened(
            tenant=user.tenant, tool_call_id=call.pk, user=user, evidence=_evidence(request)
        )
        return "Marked as not happened; it can be retried with its key."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def retry(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        commands.tool_call_retry(
            tenant=user.tenant, tool_call_id=call.pk, actor=actor_for_user(user)
        )
        return "Sent again with the same idempotency key."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def compensate(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        compensation, _ = commands.tool_call_compensate(
            tenant=user.tenant, tool_call_id=call.pk, actor=actor_for_user(user)
        )
        return f"Compensating with {compensation.pk}."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def abandon(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        commands.desk_abandon(
            tenant=user.tenant, tool_call_id=call.pk, user=user, reason=_evidence(request)
        )
        return "Abandoned."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def claim(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    def command(call: ToolCall, user: User) -> str:
        commands.desk_claim(tenant=user.tenant, tool_call_id=call.pk, user=user)
        return "It is yours now: the desk shows the other admins that you have it."

    return _run_command(request, tool_call_id, command)


@require_POST
@tenant_admin_required
def look_up_system(request: HttpRequest, system: str) -> HttpResponse:
    asked = commands.desk_look_up_system(
        tenant=request.user.tenant, system=system, user=request.user
    )
    messages.success(
        request, f"Looking up {asked} unknown call{'s' if asked != 1 else ''} at {system} now."
    )
    return redirect("desk:list")


@require_POST
@tenant_admin_required
def resume_run(request: HttpRequest, run_id: str) -> HttpResponse:
    try:
        commands.desk_resume_run(
            tenant=request.user.tenant,
            run_id=run_id,
            user=request.user,
            reason=_evidence(request),
        )
        messages.success(request, "The run is active again.")
    except DomainError as exc:
        if exc.status == 404:
            raise Http404(exc.message) from exc
        messages.error(request, exc.message)
    return redirect("desk:list")
