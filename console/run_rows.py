"""The run page's tables as flat rows, each value formatted once in Python.

The template engine resolves every `{{ a.b.c }}` and filter at each render; on a busy run
(43 calls, 50 events shown) that was ~1,850 look-ups and 104 `{% for %}` renders per request,
58 % of the page's CPU (bench_pages --profile "run page"). Here each row is a dict of
ready strings the template prints in one `{% for %}` level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from django.utils.html import format_html_join

from runs.models import Event
from toolcalls.models import ToolCall

# Calls in the run page's table at once: a long run's page shows its latest, with links to
# the others (the progress lists above still name every call).
CALLS_PER_PAGE = 20


@dataclass(frozen=True)
class CallsPage:
    number: int
    pages: int
    calls: list[ToolCall]
    first: int  # the position (1-based) of the first call shown among the run's calls
    total: int

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None

    @property
    def last(self) -> int:
        return self.first + len(self.calls) - 1


def calls_page(calls: list[ToolCall], text: str) -> CallsPage:
    """Page `text` of the run's calls (oldest first); anything unreadable shows the latest
    page, where a live run's calls are happening."""
    pages = max(1, -(-len(calls) // CALLS_PER_PAGE))
    number = int(text) if text.isdigit() and 1 <= int(text) <= pages else pages
    start = (number - 1) * CALLS_PER_PAGE
    return CallsPage(number, pages, calls[start : start + CALLS_PER_PAGE], start + 1, len(calls))


def call_links(calls: list[ToolCall], page: CallsPage) -> dict[str, str]:
    """Where a call's row is: on this page an anchor, else the page of the table holding it
    (the progress lists and the timeline link every call)."""
    shown = {call.pk for call in page.calls}
    return {
        call.pk: (
            f"#{call.pk}" if call.pk in shown else f"?calls={i // CALLS_PER_PAGE + 1}#{call.pk}"
        )
        for i, call in enumerate(calls)
    }


def call_rows(
    calls: list[ToolCall], steps: dict[str, dict[str, list[tuple]]], *, desk_links: bool
) -> list[dict[str, Any]]:
    """The calls table: `calls` with their attempts and receipts (selectors.call_steps)."""
    rows = []
    for call in calls:
        attempts, receipts = steps[call.pk]["attempts"], steps[call.pk]["receipts"]
        unknown = call.is_unknown
        error = call.last_error_name
        rows.append(
            {
                "id": call.pk,
                "intent": call.intent,
                "capability": call.capability_id,
                "key": call.idempotency_key,
                "execution": call.execution_status,
                "execution_label": call.get_execution_status_display(),
                # An error still standing, or one an earlier attempt hit and a later fixed.
                "error": error if error and (unknown or call.did_not_succeed) else "",
                "resolved_error": error if error and not (unknown or call.did_not_succeed) else "",
                "on_desk": unknown and desk_links,
                "verification": call.verification_status,
                "verification_label": call.get_verification_status_display(),
                "attempts": format_html_join(
                    "",
                    "#{} {}{}<br>",
                    (
                        (number, classification, f" ({error})" if error else "")
                        for number, classification, error in attempts
                    ),
                ),
                "receipts": format_html_join(
                    "",
                    "<code>{}</code> {} via {}<br>",
                    receipts,
                ),
            }
        )
    return rows


def timeline_rows(groups: list[dict[str, Any]], links: dict[str, str]) -> list[dict[str, Any]]:
    """The folded timeline (run_page.grouped_timeline) as one list: each group's headline,
    then its later steps. A headline with steps opens their `<details>`; the last step
    closes it."""
    rows = []
    for group in groups:
        head, *steps = group["events"]
        call_id = group["tool_call_id"]
        row = _event_row(head)
        row["call_id"] = call_id or ""
        row["call_href"] = links.get(call_id, f"#{call_id}") if call_id else ""
        if steps:
            more = len(steps)
            row["steps"] = (
                f"{more} more step{'s' if more != 1 else ''} of this call, "
                f"last: {steps[-1].event_type}"
            )
        rows.append(row)
        for n, step in enumerate(steps, start=1):
            step_row = _event_row(step)
            step_row["step"] = True
            step_row["causation_id"] = step.causation_id or ""
            step_row["closes"] = n == len(steps)
            rows.append(step_row)
    return rows


def _event_row(event: Event) -> dict[str, Any]:
    moment = timezone.localtime(event.occurred_at)
    return {
        "id": event.pk,
        "seq": event.seq,
        "type": event.event_type,
        "iso": moment.isoformat(),
        "time": moment.strftime("%Y-%m-%d %H:%M:%S"),
        "by": event.actor or event.producer,
        "payload": payload_text(event.payload),
        "step": False,
        "steps": "",
        "closes": False,
    }


def payload_text(payload: Any) -> str:
    """An event's payload as indented JSON, as the API returns it (not Python's repr)."""
    return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True, default=str)
