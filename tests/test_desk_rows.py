"""The desk's rows written in Python (console/desk.py `desk_rows`, from DeskItem tuples) are the
HTML the template's loop wrote from model instances, value for value, escaping included
(whitespace between tags aside)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.template import Context, Engine
from django.utils import timezone

from console.desk import DeskItem, desk_rows
from runs.models import Run, User
from toolcalls.models import ToolCall

# The loop as templates/toolcalls/desk.html had it before desk_rows.
TEMPLATE_LOOP = """{% for item in items %}
      <tr id="row-{% if item.call %}{{ item.call.id }}{% else %}{{ item.run.id }}{% endif %}">
        <td data-label="Waiting" title="since {{ item.since|date:'c' }}" class="dwell">{{ item.since|timesince }}</td>
        {% if item.call %}
          <td data-label="What"><a href="{% url 'desk:item' item.call.id %}">{{ item.call.capability_id }}</a> <code class="muted">{{ item.call.id }}</code><br><span class="muted">{{ item.call.last_error_name }}</span>{% if item.call.desk_owner %}<br><span class="owner">{% if item.call.desk_owner_id == user.pk %}Yours{% else %}{{ item.call.desk_owner.username }} has it{% endif %}</span>{% endif %}</td>
          <td data-label="State"><span class="state state-{{ item.call.execution_status }}">{{ item.kind }}</span></td>
        {% else %}
          <td data-label="What">The run needs a person (nothing in it is unknown: an approval expired, or the agent ended it so)</td>
          <td data-label="State"><span class="state state-needs_human">run needs_human</span></td>
        {% endif %}
        <td><a href="{% url 'runs:detail' item.run.id %}">{{ item.run.title }}</a></td>
        <td>{% if item.call %}<a href="{% url 'desk:item' item.call.id %}">Handoff packet</a>{% else %}
          <form method="post" action="{% url 'desk:resume-run' item.run.id %}">{% csrf_token %}<input name="evidence" placeholder="why it can go on" aria-label="Reason to resume"><button type="submit">Resume the run</button></form>{% endif %}</td>
      </tr>
{% endfor %}"""  # noqa: E501


def _squeeze(html: str) -> str:
    return re.sub(r">\s+<", "><", html.strip())


def test_the_rows_are_the_templates_rows(settings) -> None:
    settings.TIME_ZONE = "America/New_York"
    now = timezone.now()
    me = User(pk=7, username="alice")
    other = User(pk=8, username='<bob & "co">')
    run = Run(id="run_1", title='Refund <b>"order"</b> & co\'s')
    calls = [
        ToolCall(id="tc_1", capability_id="payments.refund", last_error_name="tool.timeout",
                 execution_status="result_unknown", run=run),
        ToolCall(id="tc_2", capability_id="carrier.<x>", last_error_name="a&b",
                 execution_status="dispatching", run=run, desk_owner=me),
        ToolCall(id="tc_3", capability_id="warehouse.reserve", last_error_name="",
                 execution_status="result_unknown", run=run, desk_owner=other),
    ]  # fmt: skip
    kinds = ["result_unknown", "lease_expired", "result_unknown"]
    items = [
        {"kind": kind, "call": call, "run": run, "since": now - timedelta(minutes=5 + 60 * n)}
        for n, (call, kind) in enumerate(zip(calls, kinds, strict=True))
    ]
    items.append({"kind": "run_needs_human", "call": None, "run": run, "since": now})
    theirs = Engine.get_default().from_string(TEMPLATE_LOOP)
    context = Context({"items": items, "user": me, "csrf_token": "tok<en>"})
    csrf = '<input type="hidden" name="csrfmiddlewaretoken" value="tok&lt;en&gt;">'
    ours = desk_rows([_desk_item(item) for item in items], user_id=me.pk, csrf_input=csrf)
    assert _squeeze(ours) == _squeeze(theirs.render(context))
    assert "Yours" in ours and "&lt;bob &amp; &quot;co&quot;&gt; has it" in ours


def _desk_item(item: dict) -> DeskItem:
    """The tuple desk_items reads for what the template was given as model instances."""
    call, run = item["call"], item["run"]
    if call is None:
        return DeskItem(item["kind"], item["since"], run.id, run.title)
    owner = call.desk_owner
    return DeskItem(
        item["kind"],
        item["since"],
        run.id,
        run.title,
        call.id,
        call.capability_id,
        call.execution_status,
        call.last_error_name,
        call.desk_owner_id,
        owner.username if owner else None,
    )
