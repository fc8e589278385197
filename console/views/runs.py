"""Console pages for runs: the tenant's list and one run's timeline."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.timesince import timesince

from console import run_page, run_rows
from console.run_list_rows import run_list_rows
from memory.feedback import run_feedback
from runs import selectors
from runs.errors import DomainError
from runs.models import Run
from runs.permissions import tenant_member_required
from toolcalls.progress import progress
from toolcalls.selectors import call_steps, run_tool_calls_for_page

RUNS_PER_PAGE = 50
# Events of the timeline on one page: a long run's page shows its latest, with a link to the
# ones before.
TIMELINE_WINDOW = 50


@tenant_member_required
def run_list(request: HttpRequest) -> HttpResponse:
    # An unknown state or an overlong search is ignored rather than refused: it's a filter.
    state = request.GET.get("state", "")
    state = state if state in Run.State.values else ""
    title = request.GET.get("q", "").strip()[:200]
    runs = selectors.run_list(tenant=request.user.tenant, state=state, title=title)
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    filters = urlencode({key: value for key, value in (("state", state), ("q", title)) if value})
    context = {
        "page": page,
        "runs": page.object_list,
        "rows": run_list_rows(page.object_list, now=timezone.now()),
        "state": state,
        "q": title,
        "filters": filters,
        "states": Run.State.choices,
    }
    template = "runs/list.html#run-rows" if request.htmx else "runs/list.html"
    return render(request, template, context)


@tenant_member_required
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    try:
        run = selectors.run_for_page(tenant=request.user.tenant, run_id=run_id)
    except DomainError as exc:
        raise Http404(exc.message) from exc
    # Every change of a run or its calls appends an event, so the last sequence number says
    # whether anything changed since the page last looked: if not, a poll costs the query
    # that read the run and no bytes (htmx swaps nothing on 204).
    last_seq = run.last_seq
    before = _before(request.GET.get("before", ""), last_seq)
    if request.htmx and request.GET.get("seen") == str(last_seq):
        return HttpResponse(status=204)
    window = selectors.run_events_window(run=run, size=TIMELINE_WINDOW, before=before)
    tool_calls = run_tool_calls_for_page(run=run)
    calls_page = run_rows.calls_page(tool_calls, request.GET.get("calls", ""))
    links = run_rows.call_links(tool_calls, calls_page)
    contract = run_page.for_people(progress(run, tool_calls), tool_calls, links)
    context = {
        "last_seq": last_seq,
        "run": run,
        # Keep refreshing while anything can still change, even after the run closed.
        "live": run.is_open or not all(call.is_settled for call in tool_calls),
        "timeline": run_rows.timeline(window, links),
        # Sequence numbers run 1, 2, 3 … per run: the first shown says how many came before.
        "earlier": window[0].seq - 1 if window else 0,
        "before": before,
        "shown": len(window),
        "decisions": selectors.run_decisions(run=run),
        "tool_calls": tool_calls,
        "calls_page": calls_page,
        # The poll keeps the page of calls someone chose; without one it follows the latest.
        "calls_asked": calls_page.number if request.GET.get("calls") else None,
        "call_rows": run_rows.call_rows(
            calls_page.calls,
            call_steps(calls=calls_page.calls),
            desk_links=request.user.is_tenant_admin,
        ),
        "progress": contract,
        "progress_lists": run_rows.progress_lists(
            contract, desk_links=request.user.is_tenant_admin
        ),
        "next_step": run_page.next_step_for_people(run, contract),
        "duration_text": timesince(
            run.created_at, run.created_at + run_page.duration(run, timezone.now())
        ),
        "agent": run_page.agent_of(run),
    }
    if request.htmx:
        response = render(request, "runs/detail.html#timeline", context)
        # 286 tells htmx to stop polling: nothing on this page can change any more.
        if not context["live"]:
            response.status_code = 286
        return response
    # Outside the polled part: the feedback form and what was said.
    context.update(feedback=run_feedback(run=run), call_options=run_rows.call_options(tool_calls))
    return render(request, "runs/detail.html", context)


def _before(text: str, last_seq: int) -> int | None:
    """The `before` of a "show earlier" link; anything else shows the latest events."""
    if text.isdigit() and 1 < int(text) <= last_seq:
        return int(text)
    return None
