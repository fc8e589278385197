"""The unknowns desk for admins: the list, one item's handoff packet, and its commands."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from runs.errors import DomainError
from runs.permissions import tenant_member_required
from toolcalls import desk, services
from toolcalls.models import ToolCall


def _admin(request: HttpRequest) -> None:
    if not request.user.is_tenant_admin:
        raise PermissionDenied("The unknowns desk is for admins.")


@tenant_member_required
def desk_list(request: HttpRequest) -> HttpResponse:
    _admin(request)
    items = desk.desk_items(tenant=request.user.tenant)
    template = "toolcalls/desk.html#desk-rows" if request.htmx else "toolcalls/desk.html"
    return render(request, template, {"items": items})


def _call(request: HttpRequest, tool_call_id: str) -> ToolCall:
    call = (
        ToolCall.objects.select_related("run", "decision", "tenant")
        .filter(tenant=request.user.tenant, pk=tool_call_id)
        .first()
    )
    if call is None:
        raise Http404("No such tool call.")
    return call


@tenant_member_required
def desk_item(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    _admin(request)
    packet = desk.handoff(_call(request, tool_call_id))
    template = (
        "toolcalls/desk_item.html#packet-status" if request.htmx else "toolcalls/desk_item.html"
    )
    return render(request, template, packet)


@require_POST
@tenant_member_required
def desk_command(request: HttpRequest, tool_call_id: str) -> HttpResponse:
    _admin(request)
    call = _call(request, tool_call_id)
    action = request.POST.get("action", "")
    tenant, user = request.user.tenant, request.user
    evidence = request.POST.get("evidence", "").strip()
    try:
        if action == "look_up":
            desk.desk_look_up(tenant=tenant, tool_call_id=call.pk, user=user)
            messages.success(request, "Looking it up now; this page shows the result.")
        elif action == "confirm":
            desk.desk_mark_confirmed(
                tenant=tenant,
                tool_call_id=call.pk,
                user=user,
                external_id=request.POST.get("external_id", ""),
                evidence=evidence,
            )
            messages.success(request, "Marked confirmed.")
        elif action == "not_happened":
            desk.desk_mark_not_happened(
                tenant=tenant, tool_call_id=call.pk, user=user, evidence=evidence
            )
            messages.success(request, "Marked as not happened; it can be retried with its key.")
        elif action == "retry":
            services.tool_call_retry(
                tenant=tenant, tool_call_id=call.pk, actor=f"user:{user.username}"
            )
            messages.success(request, "Sent again with the same idempotency key.")
        elif action == "compensate":
            compensation, _ = services.tool_call_compensate(
                tenant=tenant, tool_call_id=call.pk, actor=f"user:{user.username}"
            )
            messages.success(request, f"Compensating with {compensation.pk}.")
        elif action == "abandon":
            desk.desk_abandon(tenant=tenant, tool_call_id=call.pk, user=user, reason=evidence)
            messages.success(request, "Abandoned.")
        else:
            raise DomainError("desk.unknown_action", "Choose one of the actions.", status=400)
    except DomainError as exc:
        packet = desk.handoff(_call(request, tool_call_id))
        return render(
            request, "toolcalls/desk_item.html", {**packet, "refusal": exc}, status=exc.status
        )
    return redirect("desk:item", call.pk)


@require_POST
@tenant_member_required
def desk_resume_run(request: HttpRequest, run_id: str) -> HttpResponse:
    _admin(request)
    try:
        desk.desk_resume_run(
            tenant=request.user.tenant,
            run_id=run_id,
            user=request.user,
            reason=request.POST.get("evidence", ""),
        )
        messages.success(request, "The run is active again.")
    except DomainError as exc:
        if exc.status == 404:
            raise Http404(exc.message) from exc
        messages.error(request, exc.message)
    return redirect("desk:list")
