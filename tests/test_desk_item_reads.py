"""The desk item reads what its packet shows and no more: the run's other calls without their
JSON, receipts without their call rows, approvals' decisions with their people in one query
(console/sql.py desk_approvals, the ORM's rows and the template's HTML)."""

from __future__ import annotations

from django.db import connection
from django.template import Context, Engine
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval, ApprovalDecision
from console import desk, sql
from runs.models import Tenant, User
from tests.helpers import logged_in
from tests.sandbox_process import Sandbox
from tests.test_page_queries import grow
from toolcalls.models import E, Receipt, ToolCall, V

HOSTILE = '<script>alert("x")</script>'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"


def test_it_shows_each_decision_with_its_person_read_in_the_same_query(
    tenant: Tenant, sandbox: Sandbox, bob: User, admin_user: User
) -> None:
    grow(tenant, sandbox, {"bob": bob}, 1)
    unknown = ToolCall.objects.get(tenant=tenant, execution_status=E.RESULT_UNKNOWN)
    client = logged_in(admin_user)
    client.get(f"/desk/{unknown.pk}/")  # the person read once
    with CaptureQueriesContext(connection) as captured:
        content = client.get(f"/desk/{unknown.pk}/").content.decode()

    assert "— bob approve" in content
    decisions = [q["sql"] for q in captured if '"approvals_approvaldecision"' in q["sql"]]
    assert len(decisions) == 1
    assert '"runs_user"' in decisions[0]


def test_it_reads_neither_the_other_calls_json_nor_the_receipts_calls(
    tenant: Tenant, sandbox: Sandbox, bob: User, admin_user: User
) -> None:
    grow(tenant, sandbox, {"bob": bob}, 1)
    unknown = ToolCall.objects.get(tenant=tenant, execution_status=E.RESULT_UNKNOWN)
    with CaptureQueriesContext(connection) as captured:
        content = logged_in(admin_user).get(f"/desk/{unknown.pk}/").content.decode()

    assert "via" in content  # the receipts are shown
    receipts = [q["sql"] for q in captured if 'FROM "toolcalls_receipt"' in q["sql"]]
    assert receipts and all('"toolcalls_toolcall"."args"' not in sql for sql in receipts)
    # The call of the packet is read whole (by the ORM, or console/sql.py's desk_call, whose
    # alias for the call is c); the run's calls listed beside it are not.
    args = ('"toolcalls_toolcall"."args"', 'c."args"')
    assert sum(any(column in q["sql"] for column in args) for q in captured) == 1


def test_it_escapes_what_an_external_system_sent(
    tenant: Tenant, sandbox: Sandbox, bob: User, admin_user: User
) -> None:
    grow(tenant, sandbox, {"bob": bob}, 1)
    unknown = ToolCall.objects.get(tenant=tenant, execution_status=E.RESULT_UNKNOWN)
    receipt = Receipt.objects.filter(tool_call__run=unknown.run).first()
    Receipt.objects.filter(pk=receipt.pk).update(external_id=HOSTILE)
    ToolCall.objects.filter(pk=receipt.tool_call_id).update(external_id=HOSTILE)

    content = logged_in(admin_user).get(f"/desk/{unknown.pk}/").content.decode()

    assert "<script>" not in content
    assert f"<code>{ESCAPED}</code> for <code>{receipt.tool_call_id}</code>" in content
    assert f"→ <code>{ESCAPED}</code>" in content  # the confirmed calls


# The approvals' loop as templates/toolcalls/desk_item.html had it before approval_items.
APPROVALS_LOOP = (
    "{% for a in approvals %}<li><a href=\"{% url 'approvals:detail' a.id %}\">{{ a.id }}</a>"
    " {{ a.state }} ({{ a.rule_name }}){% for d in a.decisions.all %} — {{ d.user.username }}"
    ' {{ d.decision }}{% endfor %}</li>{% empty %}<li class="muted">None.</li>{% endfor %}'
)


def test_its_approvals_are_what_the_templates_loop_wrote(
    tenant: Tenant, sandbox: Sandbox, bob: User, admin_user: User
) -> None:
    grow(tenant, sandbox, {"bob": bob}, 2)  # two runs: each lists its own approvals only
    run = Approval.objects.filter(tenant=tenant).order_by("created_at").first().run
    consumed = Approval.objects.get(run=run, state="consumed")
    ApprovalDecision.objects.create(
        approval=consumed, user=admin_user, decision="reject", summary_hash="h" * 64
    )
    Approval.objects.filter(run=run, state="pending").update(rule_name=HOSTILE)
    User.objects.filter(pk=bob.pk).update(username='<bob & "co">')
    approvals = Approval.objects.filter(run=run).order_by("expires_at", "id")
    orm = desk.desk_approvals_orm(run.pk)

    read = sql.desk_approvals(run.pk)

    assert read == orm
    assert [(state, username, decision) for _, state, _, username, decision in read] == [
        ("consumed", '<bob & "co">', "approve"),
        ("consumed", admin_user.username, "reject"),
        ("pending", None, None),
    ]
    theirs = Engine.get_default().from_string(APPROVALS_LOOP)
    expected = theirs.render(Context({"approvals": approvals}))
    assert desk.approval_items(read) == expected
    assert ESCAPED in expected and "&lt;bob &amp; &quot;co&quot;&gt; approve" in expected
    assert desk.approval_items([]) == ""


def test_it_lists_the_runs_unsettled_and_confirmed_calls(
    tenant: Tenant, sandbox: Sandbox, bob: User, admin_user: User
) -> None:
    grow(tenant, sandbox, {"bob": bob}, 1)
    unknown = ToolCall.objects.get(tenant=tenant, execution_status=E.RESULT_UNKNOWN)
    calls = ToolCall.objects.filter(run=unknown.run).order_by("id")
    confirmed = [c.pk for c in calls if c.verification_status == V.CONFIRMED_SUCCESS]
    waiting = next(c for c in calls if c.pk != unknown.pk and c.pk not in confirmed)
    ToolCall.objects.filter(pk=waiting.pk).update(execution_status=E.DISPATCHING)

    response = logged_in(admin_user).get(f"/desk/{unknown.pk}/")

    content = response.content.decode()
    assert [c.id for c in response.context["unknown"]] == sorted([unknown.pk, waiting.pk])
    assert [c.id for c in response.context["confirmed"]] == confirmed
    assert "Unknown actions (2)" in content and f"<code>{waiting.pk}</code></a>" in content
    assert f"Confirmed actions of the run ({len(confirmed)})" in content and len(confirmed) == 3
