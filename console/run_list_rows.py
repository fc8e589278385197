"""The runs list's rows written in Python, as the inbox's and the desk's are: the template's
loop (two `{% url %}`s, `get_state_display`, the date and timesince filters a row, fifty rows)
was most of the page's CPU (bench_pages --profile "runs list"), and the first page refreshes
itself every 5 s in every open tab."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from console.formatting import escaped as _h
from console.formatting import time_units, url_pattern
from runs.models import Run


def run_list_rows(runs: Iterable[Run], *, now: datetime) -> SafeString:
    """Writes what templates/runs/list.html's loop wrote for each run, with the URL pattern,
    the state labels, the time zone and timesince's unit words worked out once a page."""
    # Escaping replaces character by character: a pattern escaped once, with an escaped id
    # in it, is the escaped URL.
    run_url = _h(url_pattern("runs:detail"))
    labels = dict(Run.State.choices)
    zone = timezone.get_current_timezone()
    units = time_units()
    rows = []
    for run in runs:
        run_id, state = _h(run.id), run.state
        url = run_url.format(run_id)
        # What the date filter's "c" wrote: the local time's isoformat().
        started = _h(run.created_at.astimezone(zone).isoformat())
        rows.append(
            f'<tr id="row-{run_id}">\n'
            f'        <td data-label="Title"><a href="{url}">{_h(run.title)}</a></td>\n'
            f'        <td data-label="State"><span class="state state-{_h(state)}">'
            f"{_h(labels.get(state, state))}</span></td>\n"
            f'        <td data-label="Run"><a href="{url}"><code>{run_id}</code></a></td>\n'
            f'        <td data-label="Correlation id"><code>{_h(run.correlation_id)}</code></td>\n'
            f'        <td data-label="Started" title="{started}">'
            f"{_h(timesince(run.created_at, now, time_strings=units))} ago</td>\n"
            "      </tr>"
        )
    return mark_safe("\n".join(rows))  # every value above went through _h
