"""The approver console: the inbox, one approval's page, and one small POST view per decision
(approve, reject, approve with edits). Everything shown comes from stored state at request
time; a decision is a command checked against what the page showed (its version and hash)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from approvals import selectors
from approvals.models import Approval
from memory.feedback import approval_feedback
from runs.errors import DomainError
from runs.permissions import tenant_member_required
from toolcalls import capabilities, gate


@tenant_member_required
def inbox(request: HttpRequest) -> HttpResponse:
    approvals = selectors.inbox(tenant=request.user.tenant)
    template = "approvals/inbox.html#inbox-rows" if request.htmx else "approvals/inbox.html"
    return render(request, template, {"approvals": approvals, "now": timezone.now()})


def _page_context(request: HttpRequest, approval: Approval, **extra: Any) -> dict[str, Any]:
    call = approval.tool_call
    capability = capabilities.get(call.capability_id)
    properties = capability.input_schema["properties"] if capability else {}
    now = timezone.now()
    return {
        "approval": approval,
        "call": call,
        "capability": capability,
        "decisions": list(approval.decisions.select_related("user")),
        "history": selectors.approval_history(approval=approval),
        "now": now,
        "can_decide": approval.can_be_decided_by(request.user, now),
        "replacement": call.approvals.filter(created_at__gt=approval.created_at)
        .order_by("-created_at")
        .first(),
        "already_approved_by_me": approval.decisions.filter(user=request.user).exists(),
        "feedback": approval_feedback(approval=approval),
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
        if not approval.is_open and approval.tool_call.is_settled:
            response.status_code = 286
        return response
    return render(request, "approvals/detail.html", context)


def _decide(
    request: HttpRequest, approval_id: str, decision: Callable[..., Approval], done: str
) -> HttpResponse:
    """Run one decision with what the page showed; a refusal is shown on the page as it is
    now, not as the stale form showed it."""
    approval = _get(request, approval_id)
    command = {
        "tenant": request.user.tenant,
        "approval_id": approval.pk,
        "user": request.user,
        "seen_version": int(request.POST.get("version") or 0),
        "seen_summary_hash": request.POST.get("summary_hash", ""),
        "reason": request.POST.get("reason", "").strip(),
    }
    try:
        current = decision(**command)
    except DomainError as exc:
        context = _page_context(request, _get(request, approval_id), refusal=exc)
        return render(request, "approvals/detail.html", context, status=exc.status)
    messages.success(request, done)
    return redirect("approvals:detail", current.pk)


@require_POST
@tenant_member_required
def approve(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, gate.tool_call_approve, "Approved.")


@require_POST
@tenant_member_required
def reject(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, gate.tool_call_reject, "Rejected.")


@require_POST
@tenant_member_required
def approve_with_edits(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)

    def decision(**command: Any) -> Approval:
        return gate.tool_call_approve_with_edits(**command, edits=_edits(request, approval))

    return _decide(request, approval_id, decision, "Approved with your edits.")


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
