"""The run page's lists, tables and timeline are written in Python (console/run_rows.py): every
value in them is escaped as the template would, and payloads read as the API writes them."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from console.run_rows import payload_text
from runs import services
from runs.models import Run, Tenant, User
from tests.helpers import logged_in, propose_in
from tests.sandbox_process import Sandbox

HOSTILE = '<script>alert("x")</script>'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"


def test_it_escapes_what_the_agent_wrote_in_every_part_of_the_page(
    run: Run, tenant: Tenant, admin_user: User, sandbox: Sandbox
) -> None:
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="note", content={"why": HOSTILE}, actor=HOSTILE
    )
    email = {"order_id": "order-002", "to": "customer-002@example.com", "subject": HOSTILE}
    propose_in(run, {**email, "body": "b"}, capability="send-email-v1", intent=HOSTILE)

    content = logged_in(admin_user).get(f"/runs/{run.pk}/").content.decode()

    assert "<script>" not in content
    assert f"by {ESCAPED}" in content  # the timeline's actor
    assert f'<span class="muted">{ESCAPED}</span>' in content  # the call's intent
    # The payloads: the decision's content and the call's arguments, as indented JSON.
    assert "&quot;why&quot;: &quot;&lt;script&gt;alert(\\&quot;x\\&quot;)" in content


@pytest.mark.parametrize(
    "payload",
    [
        {},
        [],
        None,
        "text",
        3,
        {"b": {"nested": [1, 2.5, None, True, False]}, "a": [], "c": {}},
        {"unicode": "é ü 中文 \u2028", "quotes": '"\\'},
        [[[]], [{}], {"x": [{"y": 1}]}],
        {"amount": Decimal("12.50")},  # not JSON: written by default=str, as json.dumps does
        {"tuple": (1, 2)},  # not a column's JSON: left to json.dumps
        {1: "a", 2: "b"},
    ],
)
def test_a_payload_reads_as_json_dumps_writes_it(payload: Any) -> None:
    expected = json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    assert payload_text(payload) == expected
