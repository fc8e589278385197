"""The approval page's two lists of other calls on the object, written in Python
(console/approval_page.py other_calls_html, warning_items_html), are the HTML the template's
loops wrote, value for value, escaping included."""

from __future__ import annotations

import re
from datetime import timedelta

from django.template import Context, Engine
from django.utils import timezone

from console.approval_page import other_calls_html, warning_items_html
from toolcalls.models import E, ToolCall, V

# The loops as templates/approvals/detail.html had them before.
WARN_LOOP = """{% load console_format %}{% for row in others.warn %}
      <li><code>{{ row.call.id }}</code>: {% if row.amount_text %}{{ row.amount_text }} {% endif %}<span class="state state-{{ row.call.execution_status }}">{{ row.call.get_execution_status_display }}</span>{% if row.identical %} — <strong>identical arguments</strong>{% endif %}, asked {% relative_time row.call.created_at now %} · <a href="{% url 'runs:detail' row.call.run_id %}">its run</a></li>
    {% endfor %}"""  # noqa: E501
ROWS_LOOP = """{% load console_format %}{% for row in others.rows %}<tr><td data-label="Call"><code>{{ row.call.id }}</code>{% if row.identical %} <strong>identical</strong>{% endif %}</td><td data-label="Arguments">{{ row.args_text }}</td><td data-label="State"><span class="state state-{{ row.call.execution_status }}">{{ row.call.get_execution_status_display }}</span>{% if row.call.execution_status == "completed" %}, verification {{ row.call.get_verification_status_display }}{% endif %}</td><td data-label="Asked">{% relative_time row.call.created_at now %}</td></tr>{% endfor %}"""  # noqa: E501


def _squeeze(html: str) -> str:
    return re.sub(r">\s+<", "><", html.strip())


def _rows(now) -> list[dict]:
    def row(n: int, execution: str, verification: str, **fields) -> dict:
        call = ToolCall(
            id=f"tc_{n}",
            run_id=f"run_{n}",
            execution_status=execution,
            verification_status=verification,
            created_at=now - timedelta(minutes=7 * n),
        )
        return {"call": call, "identical": False, "amount_text": "", **fields}

    return [
        row(0, E.AWAITING_APPROVAL, V.NOT_OBSERVED, identical=True, amount_text="$300.00",
            args_text="Amount $300.00; Reason duplicate charge"),
        row(1, E.COMPLETED, V.CONFIRMED_SUCCESS, amount_text='<b>"$1"</b> & co',
            args_text='Reason <script>"x"</script> & more'),
        row(2, E.COMPLETED, V.PENDING, args_text=""),
        row(3, E.RESULT_UNKNOWN, V.NOT_OBSERVED, identical=True, args_text="Amount —"),
    ]  # fmt: skip


def test_the_lists_are_the_templates_lists() -> None:
    now = timezone.now()
    rows = _rows(now)
    engine = Engine.get_default()
    context = Context({"others": {"rows": rows, "warn": rows}, "now": now})
    theirs = engine.from_string(ROWS_LOOP).render(context)
    assert other_calls_html(rows, now) == theirs
    theirs = engine.from_string(WARN_LOOP).render(context)
    ours = warning_items_html(rows, now)
    assert _squeeze(ours) == _squeeze(theirs)  # whitespace between the items aside
    assert "&lt;script&gt;" in other_calls_html(rows, now) and "<b>" not in ours
    assert ", verification Confirmed Success" in other_calls_html(rows, now)
