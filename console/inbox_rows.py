"""The approvals inbox's rows written in Python, as the desk's are (console/desk.py): at a
million events the template's loop (two `{% url %}`s, a tag, filters and a dozen look-ups per
row, fifty rows) was most of the page's CPU, and every open tab asks for it every 2 s while
anything pending changes (bench_pages --profile inbox)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.utils import dateformat
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timeuntil
from django.utils.timezone import localtime

from approvals.selectors import InboxRow
from console.formatting import escaped as _h
from console.formatting import summary_text, url_pattern


def inbox_rows(approvals: Iterable[InboxRow], *, now: datetime) -> SafeString:
    """Writes what templates/approvals/inbox.html's loop wrote for each approval (with its
    run's title: approvals/selectors.py inbox_page)."""
    detail_url = url_pattern("approvals:detail")
    run_url = url_pattern("runs:detail")
    rows = []
    for a in approvals:
        # The tag's output was autoescaped unless marked safe: conditional_escape does both.
        summary = conditional_escape(summary_text(a.capability_id, a.args, a.summary))
        expires = _h(dateformat.format(localtime(a.expires_at), "c"))
        rows.append(
            f'<tr id="row-{_h(a.id)}">\n'
            f'<td data-label="What will happen"><a href="{_h(detail_url.format(a.id))}">'
            f'{summary}</a><br><code class="muted">{_h(a.id)}</code></td>\n'
            f'<td data-label="Risk"><span class="state risk-{_h(a.risk)}">{_h(a.risk)}</span>'
            "</td>\n"
            f'<td data-label="Approvals">{_h(a.approvals_so_far)} of '
            f"{_h(a.required_approvers)}</td>\n"
            f'<td data-label="Time left" title="{expires}">{_h(timeuntil(a.expires_at, now))}'
            "</td>\n"
            f'<td data-label="Rule">{_h(a.rule_name)} <span class="muted">(policy '
            f"v{_h(a.policy_version)})</span></td>\n"
            f'<td data-label="Run"><a href="{_h(run_url.format(a.run_id))}">{_h(a.run_title)}'
            "</a></td>\n</tr>"
        )
    return mark_safe("\n".join(rows))  # every value above went through _h or conditional_escape
