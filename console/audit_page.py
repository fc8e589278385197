"""The audit page's rows: 100 run events read as tuples of the columns the page shows, with the
admin events of their time span, each written for people in one Python pass (its times, who
did it, its run's link) and as its table row, which the template places.

Why not model instances and template filters: at 100 rows a page, the template's look-ups
through each instance, `|date` twice and `{% url %}` twice per row were four fifths of the
page's server time (`bench_pages --profile audit`), and each instance decoded a payload and
two hashes the page never shows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from console.audit import AuditQuery, admin_events_of_span, audit_events, cursor_at
from runs.models import AdminEvent, Tenant

# What a run event's row shows, in this order (`_run_row` unpacks them).
COLUMNS = (
    "id",
    "run_id",
    "seq",
    "event_type",
    "actor",
    "producer",
    "occurred_at",
    "tool_call_id",
    "approval_id",
    "decision_id",
    "capability_id",
)


# A row as the page shows it, for `format_html` (which escapes each value once). Written
# here, not in the template: at 100 rows a page, a dozen template look-ups per row (each
# resolved, localized and escaped) were still half of the page's server time.
_RUN_ROW = (
    "<tr>"
    '<td data-label="When"><time datetime="{iso}">{when}</time></td>'
    '<td data-label="Event"><a href="{run_url}#{id}"><strong>{event_type}</strong></a>'
    '<br><code class="muted">{id}</code></td>'
    '<td data-label="Person">{person}</td>'
    '<td data-label="Run"><a href="{run_url}"><code>{run_id}</code></a> #{seq}</td>'
    '<td data-label="Ids">{ids}{capability}</td>'
    "</tr>"
)
_ADMIN_ROW = (
    '<tr class="admin-event">'
    '<td data-label="When"><time datetime="{iso}">{when}</time></td>'
    '<td data-label="Event"><strong>{event_type}</strong><br><code class="muted">{id}</code></td>'
    '<td data-label="Person">{person}</td>'
    '<td data-label="Run"><span class="muted">administration</span> #{seq}</td>'
    '<td data-label="Ids"><code>{subject}</code> {in_words}</td>'
    "</tr>"
)


@dataclass
class AuditPage:
    rows: list[dict[str, Any]]  # newest first; run events and admin events
    older: str  # the cursor of the next (older) page; "" on the last page


def audit_page(*, tenant: Tenant, query: AuditQuery, size: int) -> AuditPage:
    """A page of `size` run events matching `query`, with the admin events of its span."""
    # One row more than a page says whether there is an older page, without counting them all.
    events = list(audit_events(tenant=tenant, query=query).values_list(*COLUMNS)[: size + 1])
    older = ""
    if len(events) > size:
        events = events[:size]
        _, run_id, seq, _, _, _, last_shown, *_ = events[-1]
        older = cursor_at(last_shown, run_id, seq)
    else:
        last_shown = None  # the last page: its span runs to the beginning
    admin = admin_events_of_span(tenant=tenant, query=query, last_shown=last_shown)
    zone = timezone.get_current_timezone()
    run_urls: dict[str, str] = {}
    rows = [_run_row(event, zone, run_urls) for event in events]
    if admin:
        rows += [_admin_row(event, zone) for event in admin]
        # A stable sort: run events keep their (run, seq) order within the same instant.
        rows.sort(key=lambda row: row["at"], reverse=True)
    return AuditPage(rows, older)


def _times(moment: datetime, zone: tzinfo) -> tuple[str, str]:
    """What `|date:'c'` and `|date:"Y-m-d H:i:s"` wrote, in the current time zone."""
    local = moment.astimezone(zone)
    return local.isoformat(), local.strftime("%Y-%m-%d %H:%M:%S")


def _run_row(event: tuple, zone: tzinfo, run_urls: dict[str, str]) -> dict[str, Any]:
    (pk, run_id, seq, event_type, actor, producer, at, tool_call_id, approval_id, decision_id,
     capability_id) = event  # fmt: skip
    url = run_urls.get(run_id)
    if url is None:
        # A page holds a few runs' events: one reverse() per run, not two per row.
        url = run_urls[run_id] = reverse("runs:detail", args=[run_id])
    iso, when = _times(at, zone)
    shown = {
        "id": pk,
        "iso": iso,
        "when": when,
        "event_type": event_type,
        "person": actor or producer,
        "run_id": run_id,
        "run_url": url,
        "seq": seq,
        "ids": format_html_join(
            "", "<code>{}</code> ", ((i,) for i in (tool_call_id, approval_id, decision_id) if i)
        ),
        "capability": (
            format_html('<span class="muted">{}</span>', capability_id) if capability_id else ""
        ),
    }
    return {"at": at, **shown, "html": format_html(_RUN_ROW, **shown)}


def _admin_row(event: AdminEvent, zone: tzinfo) -> dict[str, Any]:
    iso, when = _times(event.occurred_at, zone)
    shown = {
        "id": event.pk,
        "iso": iso,
        "when": when,
        "event_type": event.event_type,
        "person": event.actor,
        "seq": event.seq,
        "subject": event.subject,
        "in_words": event.in_words,
    }
    return {
        "admin": True,
        "at": event.occurred_at,
        **shown,
        "html": format_html(_ADMIN_ROW, **shown),
    }
