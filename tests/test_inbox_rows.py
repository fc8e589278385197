"""The inbox's rows written in Python (console/inbox_rows.py) are the HTML the template's loop
wrote, value for value, escaping included (whitespace between tags aside)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.template import Context, Engine
from django.utils import timezone

from approvals.models import Approval
from approvals.selectors import InboxRow
from console.inbox_rows import inbox_rows
from runs.models import Run

# The loop as templates/approvals/inbox.html had it before inbox_rows.
TEMPLATE_LOOP = """{% load console_format %}{% for approval in approvals %}
      <tr id="row-{{ approval.id }}">
        <td data-label="What will happen"><a href="{% url 'approvals:detail' approval.id %}">{% summary_text approval.summary approval.capability_id approval.args %}</a><br><code class="muted">{{ approval.id }}</code></td>
        <td data-label="Risk"><span class="state risk-{{ approval.risk }}">{{ approval.risk }}</span></td>
        <td data-label="Approvals">{{ approval.approvals_so_far }} of {{ approval.required_approvers }}</td>
        <td data-label="Time left" title="{{ approval.expires_at|date:'c' }}">{{ approval.expires_at|timeuntil:now }}</td>
        <td data-label="Rule">{{ approval.rule_name }} <span class="muted">(policy v{{ approval.policy_version }})</span></td>
        <td data-label="Run"><a href="{% url 'runs:detail' approval.run_id %}">{{ approval.run.title }}</a></td>
      </tr>
{% endfor %}"""  # noqa: E501


def _squeeze(html: str) -> str:
    return re.sub(r">\s+<", "><", html.strip())


def _approval(n: int, run: Run, capability_id: str, **fields) -> Approval:
    approval = Approval(id=f"apr_{n}", run=run, **fields)
    # The inbox's annotations (approvals/selectors.py inbox).
    approval.approved_count, approval.capability_id = n, capability_id
    return approval


def _row(approval: Approval) -> InboxRow:
    """The approval as the inbox reads it (approvals/selectors.py inbox_page)."""
    fields = InboxRow._fields[:-1]
    return InboxRow(*(getattr(approval, f) for f in fields), run_title=approval.run.title)


def test_the_rows_are_the_templates_rows(settings) -> None:
    settings.TIME_ZONE = "America/New_York"
    now = timezone.now()
    run = Run(id="run_1", title='Refund <b>"order"</b> & co\'s')
    approvals = [
        _approval(
            0, run, summary="Refund 1200.00 USD to order-1", capability_id="payments.refund",
            args={"order_id": "order-1", "amount": "1200.00", "currency": "USD"},
            risk="high", required_approvers=2, rule_name="Refunds over $1,000",
            policy_version=3, expires_at=now + timedelta(minutes=42),
        ),
        _approval(
            1, run, summary='Send <script>"x"</script> & more', capability_id="mailer.send",
            args={"to": "a@b.c"}, risk="<low>", required_approvers=1,
            rule_name='Mail "anyone" <now>', policy_version=1,
            expires_at=now + timedelta(days=1, hours=3),
        ),
        _approval(
            2, run, summary="Unknown capability", capability_id="no.such", args={},
            risk="medium", required_approvers=1, rule_name="r", policy_version=12,
            expires_at=now - timedelta(minutes=1),  # expired, not yet swept
        ),
    ]  # fmt: skip
    theirs = Engine.get_default().from_string(TEMPLATE_LOOP)
    expected = theirs.render(Context({"approvals": approvals, "now": now}))
    ours = inbox_rows([_row(a) for a in approvals], now=now)
    assert _squeeze(ours) == _squeeze(expected)
    assert "&lt;script&gt;" in ours and "<script>" not in ours
