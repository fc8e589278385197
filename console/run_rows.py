"""The run page's lists and tables as HTML, each value formatted and escaped once in Python.

The template engine resolves every `{{ a.b.c }}` and filter at each render: rows of dicts
printed by `{% for %}` were still ~840 look-ups per request on a busy run (43 calls, 50
events shown), half the page's CPU (bench_pages --profile "run page"). Here each list is
one string in which every value is escaped as the template would (formatting.escaped); the
template prints it whole. The markup is the template's, kept beside the function that
fills it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from console.formatting import escaped as _h
from console.formatting import html_of as _join
from runs.selectors import TimelineEvent
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


def _desk_href(call_id: str) -> str:
    return reverse("desk:item", args=[call_id])


# --- the progress lists ---------------------------------------------------------------------


def progress_lists(contract: dict[str, Any], *, desk_links: bool) -> dict[str, SafeString]:
    """The `<li>`s of the progress contract's lists (run_page.for_people), by list."""
    verified = [
        f'<li><a href="{_h(item["href"])}">{_h(item["summary"])}</a> '
        f'<code class="muted">{_h(item["external_id"])}</code></li>'
        for item in contract["verified"]
    ]
    open_items = []
    for item in contract["open"]:
        kind = _h(item["kind"])
        line = (
            f'<li><a href="{_h(item["href"])}">{_h(item["summary"])}</a> '
            f'<span class="state state-{kind}">{kind}</span>'
        )
        if desk_links and item["kind"] in ("result_unknown", "needs_human"):
            line += f' <a href="{_h(_desk_href(item["tool_call_id"]))}">on the desk</a>'
        if item["approval_id"]:
            href = reverse("approvals:detail", args=[item["approval_id"]])
            line += f' <a href="{_h(href)}">{_h(item["approval_id"])}</a>'
        open_items.append(line + "</li>")
    failed = [
        f'<li><a href="{_h(item["href"])}">{_h(item["summary"])}</a> '
        f'<span class="error">{_h(item["error"])}</span></li>'
        for item in contract["failed"]
    ]
    return {
        "verified": _join(verified or ['<li class="muted">Nothing verified yet.</li>']),
        "open": _join(open_items or ['<li class="muted">Nothing open.</li>']),
        "failed": _join(failed),
    }


# --- the calls table ------------------------------------------------------------------------


def call_rows(
    calls: list[ToolCall], steps: dict[str, dict[str, list[tuple]]], *, desk_links: bool
) -> SafeString:
    """The calls table's `<tr>`s: `calls` with their attempts and receipts
    (selectors.call_steps)."""
    rows = []
    for call in calls:
        attempts, receipts = steps[call.pk]["attempts"], steps[call.pk]["receipts"]
        unknown = call.is_unknown
        error = call.last_error_name
        call_id = _h(call.pk)
        execution = f'<span class="state state-{_h(call.execution_status)}">'
        execution += f"{_h(call.get_execution_status_display())}</span>"
        # An error still standing, or one an earlier attempt hit and a later fixed.
        if error and (unknown or call.did_not_succeed):
            execution += f'<br><span class="error">{_h(error)}</span>'
        elif error:
            execution += f'<br><span class="muted">earlier: {_h(error)}, since resolved</span>'
        if unknown and desk_links:
            execution += f'<br><a href="{_h(_desk_href(call.pk))}">On the unknowns desk</a>'
        attempts_html = "".join(
            f"#{_h(number)} {_h(classification)}{_h(f' ({name})') if name else ''}<br>"
            for number, classification, name in attempts
        )
        receipts_html = "".join(
            f"<code>{_h(external_id)}</code> {_h(status)} via {_h(source)}<br>"
            for external_id, status, source in receipts
        )
        rows.append(
            f'<tr id="{call_id}">\n'
            f'<td data-label="Call"><code>{call_id}</code><br>'
            f'<span class="muted">{_h(call.intent)}</span></td>\n'
            f'<td data-label="Capability">{_h(call.capability_id)}<br>'
            f'<code class="muted">{_h(call.idempotency_key)}</code></td>\n'
            f'<td data-label="Execution">{execution}</td>\n'
            f'<td data-label="Verification"><span class="state state-'
            f'{_h(call.verification_status)}">{_h(call.get_verification_status_display())}'
            "</span></td>\n"
            f'<td data-label="Attempts">{attempts_html}</td>\n'
            f'<td data-label="Receipts">'
            f'{receipts_html or """<span class="muted">none</span>"""}</td>\n'
            "</tr>\n"
        )
    return _join(rows)


def call_options(calls: list[ToolCall]) -> SafeString:
    """The feedback form's `<option>` for each call of the run."""
    return _join(
        [
            f'<option value="tool_call:{_h(call.pk)}">{_h(call.capability_id)} ({_h(call.pk)})'
            "</option>"
            for call in calls
        ]
    )


# --- the timeline ---------------------------------------------------------------------------

# After a call's last step: the end of its folded list and of its headline.
_CLOSE_STEPS = "</li>\n</ol>\n</details>\n</li>\n"


def timeline(events: list[TimelineEvent], links: dict[str, str]) -> SafeString:
    """The run's events in order, each tool call's consecutive events folded under its first
    (the headline, which links the call's row); run-level events stand alone. One pass."""
    parts = []
    n = len(events)
    i = 0
    while i < n:
        head = events[i]
        call_id = head.tool_call_id
        # The call's consecutive events after its headline.
        end = i + 1
        if call_id:
            while end < n and events[end].tool_call_id == call_id:
                end += 1
        link = (
            f'<a href="{_h(links.get(call_id, f"#{call_id}"))}"><code>{_h(call_id)}</code></a>'
            if call_id
            else ""
        )
        parts.append(_event(head, link))
        steps = events[i + 1 : end]
        if not steps:
            parts.append("</li>\n")
        else:
            more = len(steps)
            summary = (
                f"{more} more step{'s' if more != 1 else ''} of this call, "
                f"last: {steps[-1].event_type}"
            )
            parts.append(
                f'<details class="steps"><summary>{_h(summary)}</summary>\n<ol class="timeline">\n'
            )
            for number, step in enumerate(steps, start=1):
                cause = _h(step.causation_id)
                link = (
                    f'<span class="muted">caused by <a href="#{cause}">{cause}</a></span>'
                    if cause
                    else ""
                )
                parts.append(_event(step, link))
                parts.append(_CLOSE_STEPS if number == more else "</li>\n")
        i = end
    return _join(parts)


def _event(event: TimelineEvent, link: str) -> str:
    """An event's `<li>`, left open (its steps, if any, go inside); `link` is markup."""
    moment = timezone.localtime(event.occurred_at)
    event_id = _h(event.id)
    return (
        f'<li id="{event_id}">\n'
        f'<span class="seq">#{event.seq}</span>\n'
        f"<strong>{_h(event.event_type)}</strong>\n"
        f'<time datetime="{moment.isoformat()}">{moment.strftime("%Y-%m-%d %H:%M:%S")}</time>\n'
        f'<span class="muted">by {_h(event.actor or event.producer)}</span>\n'
        f"{link}\n"
        f"<details><summary><code>{event_id}</code></summary>"
        f"<pre>{_h(payload_text(event.payload))}</pre></details>\n"
    )


# An encoder made once: json.dumps builds a new one for each call given options.
_SCALAR = json.JSONEncoder(ensure_ascii=False, default=str).encode


def payload_text(payload: Any) -> str:
    """An event's payload as indented JSON, as the API returns it (not Python's repr):
    exactly `json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True,
    default=str)`. With `indent`, Python 3.11's json encodes in Python, a generator step per
    value (6 % of the run page); here the indenting is a few joins and the scalars are
    encoded in C. A payload that is not plain JSON (a key not a string, a tuple) is left to
    json.dumps, whose rules for those this does not repeat."""
    try:
        return _indented(payload, "\n")
    except _NotPlain:
        return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True, default=str)


class _NotPlain(Exception):
    pass


def _indented(value: Any, newline: str) -> str:
    # `newline` is the line break and indent of the value's own line.
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = newline + "  "
        items = []
        for key, item in sorted(value.items()):
            if type(key) is not str:
                raise _NotPlain
            items.append(f"{_SCALAR(key)}: {_indented(item, inner)}")
        return "{" + inner + ("," + inner).join(items) + newline + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        inner = newline + "  "
        return "[" + inner + ("," + inner).join(_indented(v, inner) for v in value) + newline + "]"
    if isinstance(value, tuple):
        raise _NotPlain
    return _SCALAR(value)
