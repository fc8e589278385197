"""The approver console: the inbox and one approval's page. Everything shown comes from
stored state at request time; a decision is a command checked against what the page showed."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from approvals import selectors, services
from approvals.models import Approval
from runs.errors import DomainError
from runs.permissions import tenant_member_required
from toolcalls import capabilities


@tenant_member_required
def inbox(request: HttpRequest) -> HttpResponse:
    approvals = selectors.inbox(tenant=request.user.tenant)
    template = "approvals/inbox.html#inbox-rows" if request.htmx else "approvals/inbox.html"
    return render(request, template, {"approvals": approvals, "now": timezone.now()})


def _page_context(request: HttpRequest, approval: Approval, **extra: Any) -> dict[str, Any]:
    call = approval.tool_call
    capability = capabilities.get(call.capability_id)
    properties = capability.input_schema["properties"] if capability else {}
    return {
        "approval": approval,
        "call": call,
        "capability": capability,
        "decisions": list(approval.decisions.select_related("user")),
        "history": selectors.approval_history(approval=approval),
        "now": timezone.now(),
        "can_decide": (
            approval.state == Approval.State.PENDING
            and approval.expires_at > timezone.now()
            and request.user.can_decide
            and approval.requested_by_id != request.user.pk
        ),
        "replacement": call.approvals.filter(created_at__gt=approval.created_at)
        .order_by("-created_at")
        .first(),
        "already_approved_by_me": approval.decisions.filter(user=request.user).exists(),
        "edit_fields": [
            {"name": name, "type": spec.get("type", "string"), "value": approval.args.get(name, "")}
            for name, spec in properties.items()
        ],
        **extra,
    }


def _get(request: HttpRequest, approval_id: str) -> Approval:
    try:
        return selectors.approval_get(tenant=request.user.tenant, approval_id=approval_id)
    except DomainError as exc:
        raise Http404(exc.message) from exc


@tenant_member_required
def detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)
    context = _page_context(request, approval)
    if request.htmx:
        response = render(request, "approvals/detail.html#approval-banner", context)
        # Stop polling once nothing about this approval can change.
        if approval.state not in Approval.OPEN_STATES and call_settled(approval):
            response.status_code = 286
        return response
    return render(request, "approvals/detail.html", context)


def call_settled(approval: Approval) -> bool:
    return approval.tool_call.is_settled


def _edits(request: HttpRequest, approval: Approval) -> dict[str, Any]:
    """The fields the approver changed, typed by the capability's schema."""
    capability = capabilities.get(approval.tool_call.capability_id)
    edits: dict[str, Any] = {}
    for name, spec in capability.input_schema["properties"].items():
        raw = request.POST.get(f"edit__{name}")
        if raw is None or raw == str(approval.args.get(name, "")):
            continue
        if spec.get("type") == "integer":
            try:
                edits[name] = int(raw)
            except ValueError:
                edits[name] = raw  # the schema check names the field
        else:
            edits[name] = raw
    return edits


@require_POST
@tenant_member_required
def decide(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)
    action = request.POST.get("action", "")
    seen = {
        "seen_version": int(request.POST.get("version") or 0),
        "seen_summary_hash": request.POST.get("summary_hash", ""),
    }
    command = {"tenant": request.user.tenant, "approval_id": approval.pk, "user": request.user}
    reason = request.POST.get("reason", "").strip()
    try:
        if action == "approve":
            services.approval_approve(**command, **seen, reason=reason)
            messages.success(request, "Approved.")
        elif action == "reject":
            services.approval_reject(**command, **seen, reason=reason)
            messages.success(request, "Rejected.")
        elif action == "edit":
            current = services.approval_approve_with_edits(
                **command, **seen, edits=_edits(request, approval), reason=reason
            )
            messages.success(request, "Approved with your edits.")
            return redirect("approvals:detail", current.pk)
        else:
            raise DomainError(
                "approval.unknown_action", "Choose approve, reject or edit.", status=400
            )
    except DomainError as exc:
        # Show the refusal on the page as it is now, not as the stale form showed it.
        fresh = _get(request, approval_id)
        context = _page_context(request, fresh, refusal=exc)
        return render(request, "approvals/detail.html", context, status=exc.status)
    return redirect("approvals:detail", approval.pk)
