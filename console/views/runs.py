"""Console pages for runs: the tenant's list and one run's timeline."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from memory.feedback import run_feedback
from runs import selectors
from runs.errors import DomainError
from runs.permissions import tenant_member_required
from toolcalls.progress import progress
from toolcalls.selectors import run_tool_calls


@tenant_member_required
def run_list(request: HttpRequest) -> HttpResponse:
    runs = selectors.run_list(tenant=request.user.tenant)[:200]
    template = "runs/list.html#run-rows" if request.htmx else "runs/list.html"
    return render(request, template, {"runs": runs})


@tenant_member_required
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    try:
        run = selectors.run_get(tenant=request.user.tenant, run_id=run_id)
    except DomainError as exc:
        raise Http404(exc.message) from exc
    tool_calls = list(run_tool_calls(run=run))
    context = {
        "run": run,
        # Keep refreshing while anything can still change, even after the run closed.
        "live": run.is_open or not all(call.is_settled for call in tool_calls),
        "events": selectors.run_events(run=run),
        "decisions": selectors.run_decisions(run=run),
        "tool_calls": tool_calls,
        "progress": progress(run, tool_calls),
    }
    if request.htmx:
        response = render(request, "runs/detail.html#timeline", context)
        # 286 tells htmx to stop polling: nothing on this page can change any more.
        if not context["live"]:
            response.status_code = 286
        return response
    return render(request, "runs/detail.html", {**context, "feedback": run_feedback(run=run)})
