"""The runs list's rows written in Python (console/run_list_rows.py) are the HTML the
template's loop wrote, value for value, escaping included (whitespace between tags aside)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.template import Context, Engine
from django.utils import timezone

from console.run_list_rows import run_list_rows
from runs.models import Run

# The loop as templates/runs/list.html had it before run_list_rows.
TEMPLATE_LOOP = """{% for run in runs %}
      <tr id="row-{{ run.id }}">
        <td data-label="Title"><a href="{% url 'runs:detail' run.id %}">{{ run.title }}</a></td>
        <td data-label="State"><span class="state state-{{ run.state }}">{{ run.get_state_display }}</span></td>
        <td data-label="Run"><a href="{% url 'runs:detail' run.id %}"><code>{{ run.id }}</code></a></td>
        <td data-label="Correlation id"><code>{{ run.correlation_id }}</code></td>
        <td data-label="Started" title="{{ run.created_at|date:'c' }}">{{ run.created_at|timesince }} ago</td>
      </tr>
{% endfor %}"""  # noqa: E501


def _squeeze(html: str) -> str:
    return re.sub(r">\s+<", "><", html.strip())


def test_the_rows_are_the_templates_rows(settings) -> None:
    settings.TIME_ZONE = "America/New_York"
    now = timezone.now()
    runs = [
        Run(
            id="run_1", title='Refund <b>"order"</b> & co\'s', state=Run.State.ACTIVE,
            correlation_id="corr-1", created_at=now - timedelta(minutes=3, seconds=5),
        ),
        Run(
            id="run_2", title="Mail <i>", state=Run.State.COMPLETED_WITH_DEGRADATION,
            correlation_id='c"2"', created_at=now - timedelta(days=40, hours=3),
        ),
        Run(
            id="run_3", title="", state="no_such_state", correlation_id=None,
            created_at=now - timedelta(seconds=20),
        ),
    ]  # fmt: skip
    theirs = Engine.get_default().from_string(TEMPLATE_LOOP)
    expected = theirs.render(Context({"runs": runs}))
    ours = run_list_rows(runs, now=now)
    assert _squeeze(ours) == _squeeze(expected)
    assert "&lt;b&gt;" in ours and "<b>" not in ours
    assert "Completed With Degradation" in ours and "1\xa0month, 1\xa0week ago" in ours
