"""Reads of the unknowns desk: what automation could not settle, and each item's handoff
packet. Its commands are in toolcalls/commands.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from approvals.models import Approval, ApprovalDecision
from console import sql
from console.formatting import escaped as _h
from console.formatting import html_of as _join
from console.formatting import time_units, url_pattern
from runs.models import Event, Run, Tenant
from toolcalls import capabilities
from toolcalls.models import DESK_STATUSES, E, Receipt, ToolCall, V

# --- reads ----------------------------------------------------------------------------------


def desk_has_items(*, tenant: Tenant) -> bool:
    """Is anything waiting on the desk? Two EXISTS queries, for the start page."""
    return (
        _stuck_calls(tenant, timezone.now()).exists()
        or Run.objects.filter(tenant=tenant, state=Run.State.NEEDS_HUMAN).exists()
    )


def _stuck_calls(tenant: Tenant, now: datetime) -> QuerySet[ToolCall]:
    # The DESK_STATUSES filter repeats the partial index's condition so that PostgreSQL uses
    # it; the second filter leaves out dispatches whose worker still holds the lease. It says
    # "not dispatching" rather than "unknown": PostgreSQL multiplies two filters on the status
    # as if unrelated, and `IN DESK AND IN UNKNOWN` made it expect 90 rows of 2,000 and sort
    # them all rather than read the first hundred in the index's order.
    return ToolCall.objects.filter(tenant=tenant, execution_status__in=DESK_STATUSES).filter(
        ~Q(execution_status=E.DISPATCHING) | Q(lease_expires_at__lt=now)
    )


def _runs_needing_a_person(tenant: Tenant, now: datetime) -> QuerySet[Run]:
    """Runs handed to a person with none of their calls on the desk (those show the run)."""
    return Run.objects.filter(tenant=tenant, state=Run.State.NEEDS_HUMAN).exclude(
        Exists(_stuck_calls(tenant, now).filter(run=OuterRef("pk")))
    )


class DeskItem(NamedTuple):
    """One row of the desk: a stuck call with its run, or a run that needs a person (no call).
    A tuple, not model instances: building ~200 of those a page was most of its CPU."""

    kind: str  # the call's status, "lease_expired" or "run_needs_human"
    since: datetime
    run_id: str
    run_title: str
    call_id: str | None = None
    capability_id: str = ""
    execution_status: str = ""
    last_error_name: str = ""
    desk_owner_id: int | None = None
    desk_owner_username: str | None = None


def desk_items(*, tenant: Tenant, limit: int) -> list[DeskItem]:
    """The `limit` longest waits on the desk: unknown outcomes, dispatches whose worker's lease
    expired, and runs that need a person. Ordered and cut in SQL, on the calls' stored
    `status_since` (toolcall_desk index), so an outage's thousands of calls cost no more than
    a hundred. Written-out SQL on PostgreSQL (console/sql.py), the ORM elsewhere."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        calls = sql.desk_calls(tenant_id=tenant.pk, now=now, limit=limit)
        runs = sql.desk_runs(tenant_id=tenant.pk, now=now, limit=limit)
    else:
        calls = desk_calls_orm(tenant=tenant, now=now, limit=limit)
        runs = desk_runs_orm(tenant=tenant, now=now, limit=limit)
    items = list(map(DeskItem._make, calls))
    # Runs needing a person are few (a run waits for one person, not for an outage): their
    # time is their last run.needs_human event.
    items += [DeskItem(_RUN_KIND, since or now, run_id, title) for run_id, title, since in runs]
    # Stable: at the same moment, calls (in the index's order) before runs, as before.
    return sorted(items, key=_SINCE)[:limit]


_RUN_KIND = "run_needs_human"
_SINCE = attrgetter("since")


def desk_calls_orm(*, tenant: Tenant, now: datetime, limit: int) -> list[tuple]:
    """What sql.desk_calls reads, through the ORM: DeskItem's fields of the longest waits."""
    rows = (
        _stuck_calls(tenant, now)
        .order_by("status_since", "id")
        .values_list(
            "execution_status",
            "status_since",
            "run_id",
            "run__title",
            "id",
            "capability_id",
            "execution_status",
            "last_error_name",
            "desk_owner_id",
            "desk_owner__username",
        )[:limit]
    )
    return [(_kind(status), *rest) for status, *rest in rows]


def _kind(status: str) -> str:
    return "lease_expired" if status == E.DISPATCHING else status


def desk_runs_orm(*, tenant: Tenant, now: datetime, limit: int) -> list[tuple]:
    """What sql.desk_runs reads, through the ORM: (id, title, last run.needs_human or None)."""
    return list(
        _runs_needing_a_person(tenant, now)
        .annotate(
            human_since=Subquery(
                Event.objects.filter(run=OuterRef("pk"), event_type="run.needs_human")
                .order_by("-seq")
                .values("occurred_at")[:1]
            )
        )
        .order_by("human_since")
        .values_list("id", "title", "human_since")[:limit]
    )


@dataclass(frozen=True)
class DeskCounts:
    items: int
    systems: list[tuple[str, int]]  # external systems with unknown outcomes, and how many


def desk_counts(*, tenant: Tenant) -> DeskCounts:
    """How many items the desk holds, and per external system how many have a look-up (during
    an outage an admin looks them all up at once): counted on the toolcall_desk index only.
    Written-out SQL on PostgreSQL: compiling the ORM's two queries cost more than the page's
    rows' queries together."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        by_capability = sql.desk_calls_by_capability(tenant_id=tenant.pk, now=now)
        runs = sql.desk_runs_count(tenant_id=tenant.pk, now=now)
    else:
        by_capability = desk_calls_by_capability_orm(tenant=tenant, now=now)
        runs = _runs_needing_a_person(tenant, now).count()
    calls, systems = 0, {}
    for capability_id, count in by_capability:
        calls += count
        capability = capabilities.get(capability_id)
        if capability and capability.lookup_path:
            systems[capability.system] = systems.get(capability.system, 0) + count
    return DeskCounts(calls + runs, sorted(systems.items()))


def desk_calls_by_capability_orm(*, tenant: Tenant, now: datetime) -> list[tuple[str, int]]:
    """What sql.desk_calls_by_capability reads, through the ORM: (capability, stuck calls)."""
    return list(
        _stuck_calls(tenant, now)
        .order_by()
        .values("capability_id")
        .annotate(count=Count("*"))
        .values_list("capability_id", "count")
    )


def handoff(call: ToolCall) -> dict[str, Any]:
    """Everything a person needs to decide about one unknown action."""
    run = call.run
    capability = capabilities.get(call.capability_id)
    calls = _run_calls(run)
    events = list(Event.objects.filter(tool_call_id=call.pk).order_by("seq"))
    confirmed = [c for c in calls if c.verification_status == V.CONFIRMED_SUCCESS]
    receipts = list(
        Receipt.objects.filter(tool_call__run=run)
        .order_by("id")
        .values_list("external_id", "tool_call_id", "status", "source")
    )
    return {
        "run": run,
        "call": call,
        "capability": capability,
        "summary": capability.summary(call.args) if capability else call.capability_id,
        "decision": call.decision,
        "confirmed": confirmed,
        # The two long lists (every call and receipt of the run), written as HTML in one
        # pass: in the template they were most of the page's look-ups.
        "confirmed_items": _join(
            [
                f"<li><code>{_h(c.id)}</code> {_h(c.capability_id)} → "
                f"<code>{_h(c.external_id)}</code></li>"
                for c in confirmed
            ]
        ),
        "receipt_items": _join(
            [
                f"<li><code>{_h(external_id)}</code> for <code>{_h(call_id)}</code>: "
                f"{_h(status)} via {_h(source)}</li>"
                for external_id, call_id, status, source in receipts
            ]
        ),
        "unknown": [c for c in calls if c.execution_status in _UNSETTLED],
        "attempts": list(call.attempts.order_by("number")),
        # Each decision with its person in the same query: one query for all of them.
        "approval_items": approval_items(
            sql.desk_approvals(run.pk)
            if connection.vendor == "postgresql"
            else desk_approvals_orm(run.pk)
        ),
        "events": events,
        "lookups": [lookup_result(event) for event in events if event.event_type == LOOKED_UP],
        "suggestion": suggestion(call, capability),
        "unresolved": call.is_unknown or call.execution_status == E.DISPATCHING,
    }


def desk_approvals_orm(run_id: str) -> list[tuple]:
    """What sql.desk_approvals reads, through the ORM: a row per decision of each approval of
    the run (approval id, state, rule, decider's username, decision), NULLs for none."""
    approvals = (
        Approval.objects.filter(run_id=run_id)
        .order_by("expires_at", "id")
        .prefetch_related(Prefetch("decisions", ApprovalDecision.objects.select_related("user")))
    )
    rows = []
    for approval in approvals:
        head = (approval.id, approval.state, approval.rule_name)
        decisions = approval.decisions.all()
        rows += [(*head, d.user.username, d.decision) for d in decisions] or [(*head, None, None)]
    return rows


def approval_items(rows: list[tuple]) -> SafeString:
    """The packet's approvals as list items, from desk_approvals' rows: what the template's
    loop over approvals and their decisions wrote."""
    url = _h(url_pattern("approvals:detail"))
    parts, current = [], None
    for approval_id, state, rule_name, username, decision in rows:
        if approval_id != current:
            parts.append("</li>" if current is not None else "")
            current, shown = approval_id, _h(approval_id)
            parts.append(
                f'<li><a href="{url.format(shown)}">{shown}</a> {_h(state)} ({_h(rule_name)})'
            )
        if decision is not None:
            parts.append(f" — {_h(username)} {_h(decision)}")
    parts.append("</li>" if current is not None else "")
    return _join(parts)


def _run_calls(run: Run) -> list[Any]:
    """The run's calls by id, capability and status only: their arguments and results (JSON,
    most of a row) are not read, and they are named tuples, not instances (a busy run has
    dozens)."""
    fields = ("id", "capability_id", "external_id", "execution_status", "verification_status")
    return list(ToolCall.objects.filter(run=run).order_by("id").values_list(*fields, named=True))


# What call.is_unknown says, and dispatches (their lease may have expired).
_UNSETTLED = frozenset(ToolCall.UNKNOWN) | {E.DISPATCHING}
LOOKED_UP = "tool_call.looked_up"


def lookup_result(event: Event) -> dict[str, Any]:
    """One look-up at the external system, in words: found, not found, or failed (and why)."""
    payload = event.payload
    if payload.get("found"):
        outcome = f"found ({payload.get('external_id', '')})"
    elif payload.get("error_name"):
        outcome = f"failed: {payload['error_name']} {payload.get('message', '')}".strip()
    elif payload.get("within_consistency_window"):
        outcome = "not found yet (inside the consistency window: proves nothing)"
    else:
        outcome = "not found"
    return {"at": event.occurred_at, "number": payload.get("lookup"), "outcome": outcome}


def suggestion(call: ToolCall, capability: capabilities.Capability | None) -> str:
    """The next step for this call as it is now (recomputed after every resolution)."""
    if not (call.is_unknown or call.execution_status == E.DISPATCHING):
        return settled_suggestion(call, capability)
    if call.execution_status == E.DISPATCHING:
        return (
            "Its worker stopped answering (the lease expired): look it up now; the sweeper "
            "will do the same within seconds."
        )
    if capability and capability.lookup_path:
        return (
            f"Look it up now at {capability.system}. If it is found, it is confirmed with the "
            f"receipt. If it stays missing past the {capability.consistency_window:g} s "
            "consistency window, mark it as not happened and retry with the same key."
        )
    if capability and capability.remote_dedupe_window:
        return (
            f"{capability.system} has no look-up but deduplicates our key: retrying with the "
            "same key cannot double it."
        )
    return (
        f"{call.capability_id} has no look-up and the system does not deduplicate: check "
        "at the system by hand, then mark it confirmed (with its id) or not happened."
    )


def settled_suggestion(call: ToolCall, capability: capabilities.Capability | None) -> str:
    if call.last_error_name == "tool.did_not_happen" and call.execution_status == E.FAILED:
        return (
            "It did not happen: retry it with the same key if it is still wanted, or leave it "
            "failed and let the run go on."
        )
    if call.execution_status == E.FAILED:
        return f"Nothing more to do here: it failed ({call.last_error_name or 'no error'})."
    if call.is_verified:
        compensable = capability and capability.compensation and not call.has_compensation
        more = (
            f" If it must be undone, compensate it ({capability.compensation})."
            if compensable
            else ""
        )
        return f"Nothing to do: it happened and is confirmed ({call.external_id}).{more}"
    return (
        f"Nothing to do now: it is {call.get_execution_status_display().lower()}, verification "
        f"{call.get_verification_status_display().lower()}; it settles by itself."
    )


def desk_rows(items: list[DeskItem], *, user_id: int, csrf_input: str) -> str:
    """The desk's rows as HTML, in one pass: at a million events the template's loop (four
    `{% url %}`s, filters and look-ups per row, a hundred rows) was most of the page's time.
    Writes what templates/toolcalls/desk.html wrote; `csrf_input` is the hidden input
    `{% csrf_token %}` writes."""
    # Escaping replaces character by character: a pattern escaped once, with an escaped id
    # in it, is the escaped URL.
    item_url = _h(url_pattern("desk:item"))
    run_url = _h(url_pattern("runs:detail"))
    resume_url = _h(url_pattern("desk:resume-run"))
    zone = timezone.get_current_timezone()
    units = time_units()
    rows = []
    for item in items:
        # What localtime() and the date filter's "c" do, with the time zone read once a page.
        since = item.since.astimezone(zone)
        dwell = _h(timesince(since, time_strings=units))
        waiting = f'title="since {_h(since.isoformat())}" class="dwell">{dwell}'
        run_id = _h(item.run_id)
        if item.call_id:
            row_id = _h(item.call_id)
            url = item_url.format(row_id)
            what = _call_cells(item, row_id, user_id, url)
            last = f'<a href="{url}">Handoff packet</a>'
        else:
            row_id, what = run_id, _RUN_CELLS
            action = resume_url.format(run_id)
            last = f'\n          <form method="post" action="{action}">{csrf_input}{_RESUME}'
        run = f'<a href="{run_url.format(run_id)}">{_h(item.run_title)}</a>'
        rows.append(
            f'<tr id="row-{row_id}">\n        <td data-label="Waiting"'
            f" {waiting}</td>\n        {what}\n        <td>{run}</td>\n"
            f"        <td>{last}</td>\n      </tr>"
        )
    return "\n".join(rows)


_RESUME = (
    '<input name="evidence" placeholder="why it can go on" aria-label="Reason to resume">'
    '<button type="submit">Resume the run</button></form>'
)
_RUN_CELLS = (
    '<td data-label="What">The run needs a person (nothing in it is unknown: an approval expired,'
    ' or the agent ended it so)</td>\n          <td data-label="State"><span class="state'
    ' state-needs_human">run needs_human</span></td>'
)


def _call_cells(item: DeskItem, call_id: str, user_id: int, url: str) -> str:
    """`call_id` and `url` come escaped."""
    owner = ""
    if item.desk_owner_id:
        mine = item.desk_owner_id == user_id
        who = "Yours" if mine else f"{_h(item.desk_owner_username)} has it"
        owner = f'<br><span class="owner">{who}</span>'
    return (
        f'<td data-label="What"><a href="{url}">{_h(item.capability_id)}</a> <code class="muted">'
        f'{call_id}</code><br><span class="muted">{_h(item.last_error_name)}</span>'
        f"{owner}</td>\n"
        f'          <td data-label="State"><span class="state state-{_h(item.execution_status)}">'
        f"{_h(item.kind)}</span></td>"
    )
