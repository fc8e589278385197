"""The approver console: the inbox, one approval's page, and one small POST view per decision
(approve, reject, approve with edits). Everything shown comes from stored state at request
time; a decision is a command checked against what the page showed (its version and hash)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from approvals import selectors
from approvals.models import Approval
from console import approval_page as page
from console import formatting, sql
from console.inbox_rows import inbox_rows
from console.views.approval_edit import preview_from_post
from memory.feedback import approval_feedback
from runs.errors import DomainError, not_found
from runs.permissions import tenant_member_required
from toolcalls import capabilities, gate
from toolcalls.checks import edit_value, invalid

INBOX_PAGE_SIZE = 50


@tenant_member_required
def inbox(request: HttpRequest) -> HttpResponse:
    tenant, now = request.user.tenant, timezone.now()
    page = _page_number(request.GET.get("page", ""))
    # Every open tab polls this every 2 s: when nothing pending changed, one small query
    # answers and htmx swaps nothing (204).
    state = selectors.inbox_state(tenant=tenant)
    seen = state.token(now)
    if request.htmx and request.GET.get("seen") == seen:
        return HttpResponse(status=204)
    offset = (page - 1) * INBOX_PAGE_SIZE
    # One row more than a page says whether a next page exists, without counting.
    rows = selectors.inbox_page(tenant=tenant, offset=offset, limit=INBOX_PAGE_SIZE + 1)
    context = {
        "approvals": rows[:INBOX_PAGE_SIZE],
        "rows": inbox_rows(rows[:INBOX_PAGE_SIZE], now=now),
        "now": now,
        "seen": seen,
        "page": page,
        "page_size": INBOX_PAGE_SIZE,
        "first_number": offset + 1,
        "last_number": offset + len(rows[:INBOX_PAGE_SIZE]),
        "next_page": page + 1 if len(rows) > INBOX_PAGE_SIZE else None,
        "previous_page": page - 1 if page > 1 else None,
        "total": state.count,
        # The navigation's count: the same count, read once (approvals/context_processors.py).
        "pending_approvals": state.count,
    }
    template = "approvals/inbox.html#inbox" if request.htmx else "approvals/inbox.html"
    return render(request, template, context)


def _page_number(text: str) -> int:
    # A page it cannot read is the first page: it's navigation, not a command.
    return int(text) if text.isdigit() and 0 < int(text) < 10_000 else 1


def _banner_context(request: HttpRequest, approval: Approval) -> dict[str, Any]:
    """What the banner shows: all its poll (every 2 s per open page) needs to read."""
    call = approval.tool_call
    now = timezone.now()
    decisions = list(approval.decisions.select_related("user"))
    invalidated = approval.state == Approval.State.INVALIDATED
    return {
        "approval": approval,
        "call": call,
        "capability": capabilities.get(call.capability_id),
        "decisions": decisions,
        "now": now,
        "can_decide": approval.can_be_decided_by(request.user, now),
        "announcement": announcement(approval, decisions, now),
        # Only an invalidated approval names the one that replaced it.
        "replacement": call.approvals.filter(created_at__gt=approval.created_at)
        .order_by("-created_at")
        .first()
        if invalidated
        else None,
    }


def _page_context(request: HttpRequest, approval: Approval, **extra: Any) -> dict[str, Any]:
    banner = _banner_context(request, approval)
    call, capability, decisions, now = (
        banner["call"],
        banner["capability"],
        banner["decisions"],
        banner["now"],
    )
    # A refused preview comes back here (after a redirect) with what was typed and why not.
    # (Not by the banner's poll, which would take it before the page shows it.)
    refused_edit = {} if request.htmx else request.session.pop(f"edit-form:{approval.pk}", {})
    mine = any(d.user_id == request.user.pk for d in decisions)
    return {
        **banner,
        "summary": formatting.summary_text(capability, approval.args, approval.summary),
        "history": selectors.approval_history(approval=approval),
        "already_approved_by_me": mine,
        # The link shows only to someone with nothing left to do here.
        "next_approval": selectors.next_for(user=request.user, after=approval)
        if mine or not banner["can_decide"]
        else None,
        "arguments": formatting.argument_rows(capability, approval.args),
        "why": page.why_asked(approval, capability),
        "decided": page.edits_made(decisions, capability, approval.args),
        "decision_json": page.decision_json(call),
        "others": page.same_object_calls(request.user.tenant, call, capability, now),
        "edit_fields": page.edit_fields(
            approval, capability, refused_edit.get("typed"), refused_edit.get("problems")
        ),
        "refused_edit": refused_edit,
        "edit_form_problem": refused_edit.get("problems", {}).get(""),
        "feedback": approval_feedback(approval=approval),
        **extra,
    }


def _get(request: HttpRequest, approval_id: str) -> Approval:
    if connection.vendor != "postgresql":
        try:
            return selectors.approval_get(tenant=request.user.tenant, approval_id=approval_id)
        except DomainError as exc:
            raise Http404(exc.message) from exc
    # The same read written out (console/sql.py): every open approval page asks for it.
    approval = sql.approval_for_page(tenant_id=request.user.tenant_id, approval_id=approval_id)
    if approval is None:
        raise Http404(not_found("approval", approval_id).message)
    return approval


@tenant_member_required
def detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)
    if request.htmx:
        context = _banner_context(request, approval)
        response = render(request, "approvals/detail.html#approval-banner", context)
        # Stop polling once nothing about this approval can change.
        if not approval.is_open and approval.tool_call.is_settled:
            response.status_code = 286
        return response
    return render(request, "approvals/detail.html", _page_context(request, approval))


def announcement(approval: Approval, decisions: list, now: datetime) -> str:
    """The banner in one sentence, for screen readers: it changes only when the state does."""
    people = ", ".join(decision.user.username for decision in decisions)
    if approval.state == Approval.State.PENDING and approval.expires_at <= now:
        return "Expired without a decision."
    if approval.state == Approval.State.PENDING:
        return f"{len(decisions)} of {approval.required_approvers} approvals so far."
    if approval.state in (Approval.State.APPROVED, Approval.State.CONSUMED):
        return f"Approved by {people}."
    if approval.state == Approval.State.REJECTED:
        return f"Rejected by {decisions[-1].user.username}." if decisions else "Rejected."
    return f"This approval is {approval.get_state_display().lower()}."


def _decide(
    request: HttpRequest, approval_id: str, decision: Callable[..., Approval], done: str
) -> HttpResponse:
    """Run one decision with what the page showed; a refusal is shown on the page as it is
    now, not as the stale form showed it. The decision reads the approval itself: an unknown
    id is refused there (and is a 404 below)."""
    command = {
        "tenant": request.user.tenant,
        "approval_id": approval_id,
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
    messages.success(request, f"{done} — {what_happens_now(current)}")
    return redirect("approvals:detail", current.pk)


def what_happens_now(approval: Approval) -> str:
    """The flash after a decision says what it led to, not only what was clicked (`approval`
    is the row the decision wrote, as it committed it: no need to read it again)."""
    if approval.state == Approval.State.PENDING:
        missing = approval.required_approvers - approval.approvals_so_far
        return (
            f"{approval.approvals_so_far} of {approval.required_approvers}, waiting for "
            f"{'a second' if missing == 1 else str(missing) + ' more'} approver"
            f"{'s' if missing > 1 else ''}."
        )
    if approval.state == Approval.State.REJECTED:
        return "the call will not run, and the agent is told why."
    if approval.state == Approval.State.INVALIDATED:
        return "the edited arguments need no approval: the call is on its way."
    return "the call is on its way."


@require_POST
@tenant_member_required
def approve(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, gate.tool_call_approve, "Approved")


@require_POST
@tenant_member_required
def reject(request: HttpRequest, approval_id: str) -> HttpResponse:
    return _decide(request, approval_id, gate.tool_call_reject, "Rejected")


@require_POST
@tenant_member_required
def approve_with_edits(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = _get(request, approval_id)

    def decision(**command: Any) -> Approval:
        # From the confirm step: the edit is the one previewed, at the version previewed.
        preview = preview_from_post(request, approval)
        if preview is not None:
            return gate.tool_call_approve_with_edits(**{**command, **preview.command()})
        return gate.tool_call_approve_with_edits(**command, edits=_edits(request, approval))

    return _decide(request, approval_id, decision, "Approved with your edits")


def _edits(request: HttpRequest, approval: Approval) -> dict[str, Any]:
    """The fields the approver changed, parsed strictly as the capability's schema types them
    (the service checks the values again, and refuses fields that identify the object)."""
    capability = capabilities.get(approval.tool_call.capability_id)
    if capability is None:
        return {}
    edits: dict[str, Any] = {}
    problems = []
    for name, spec in capability.input_schema["properties"].items():
        raw = request.POST.get(f"edit__{name}")
        if raw is None or raw == str(approval.args.get(name, "")):
            continue
        try:
            edits[name] = edit_value(spec, raw)
        except ValueError as exc:
            problems.append({"field": f"args.{name}", "problem": str(exc)})
    if problems:
        raise invalid(problems)
    return edits
