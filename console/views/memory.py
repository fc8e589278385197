"""Run memory for people: a feedback form on the run page and on the approval page (one POST
view each), and the eval-trace export for the tenant's admins."""

from __future__ import annotations

from django.contrib import messages
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals import selectors as approval_selectors
from console.audit import parse_moment
from memory import eval_trace
from memory.feedback import feedback_record
from memory.models import Feedback
from runs import selectors as run_selectors
from runs.errors import DomainError
from runs.permissions import tenant_admin_required, tenant_member_required
from runs.services import actor_for_user


def _record(request: HttpRequest, run_id: str, subject_kind: str, subject_id: str) -> None:
    """Record the form's feedback; a refusal is shown as a message on the page it came from."""
    rating = request.POST.get("rating", "").strip()
    try:
        feedback_record(
            tenant=request.user.tenant,
            run_id=run_id,
            subject_kind=subject_kind,
            subject_id=subject_id,
            rating=int(rating) if rating in {"1", "2", "3", "4", "5"} else None,
            label=request.POST.get("label", "").strip().lower().replace(" ", "_")[:50],
            text=request.POST.get("text", "").strip()[:4000],
            actor=actor_for_user(request.user),
            producer="console",
            user=request.user,
        )
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Your feedback is recorded. It changes nothing in the run.")


@require_POST
@tenant_member_required
def run_feedback(request: HttpRequest, run_id: str) -> HttpResponse:
    try:
        run = run_selectors.run_get(tenant=request.user.tenant, run_id=run_id)
    except DomainError as exc:
        raise Http404(exc.message) from exc
    # "run", or "<kind>:<id>" for one of its decisions or tool calls.
    kind, _, subject_id = request.POST.get("about", "run").partition(":")
    if kind not in Feedback.Subject.values:
        kind, subject_id = Feedback.Subject.RUN, ""
    _record(request, run.pk, kind, subject_id)
    return redirect("runs:detail", run.pk)


@require_POST
@tenant_member_required
def approval_feedback(request: HttpRequest, approval_id: str) -> HttpResponse:
    try:
        approval = approval_selectors.approval_get(
            tenant=request.user.tenant, approval_id=approval_id
        )
    except DomainError as exc:
        raise Http404(exc.message) from exc
    _record(request, approval.run_id, Feedback.Subject.APPROVAL, approval.pk)
    return redirect("approvals:detail", approval.pk)


@require_GET
@tenant_admin_required
def eval_trace_export(request: HttpRequest) -> HttpResponse:
    """The tenant's eval traces as JSON Lines. People read them as tenant admins (the eval
    role); API keys will with the eval:read scope."""
    since = request.GET.get("since", "").strip()
    try:
        moment = parse_moment(since) if since else None
    except ValueError:
        return HttpResponseBadRequest(
            f"“{since}” is not an ISO 8601 date or date-time.", content_type="text/plain"
        )
    tenant = request.user.tenant
    records = eval_trace.eval_traces(tenant=tenant, since=moment)
    response = StreamingHttpResponse(eval_trace.jsonl(records), content_type="application/x-ndjson")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = (
        f'attachment; filename="eval-traces-{tenant.slug}-{stamp}.jsonl"'
    )
    return response
