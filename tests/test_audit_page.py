"""The audit page's rows (console/audit_page.py) say what the page said when its template read
each event's model instance through `|date`, `|default` and `{% url %}`."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import dateformat, timezone

from console.audit import AuditQuery
from console.audit_page import audit_page
from runs import services as run_services
from runs.admin_events import admin_event_append
from runs.models import AdminEvent, Event, Tenant, User
from tests.helpers import BIG_REFUND, logged_in, propose_in
from tests.sandbox_process import Sandbox

AGENT = "api_key:key_agent0001"


def as_the_template_wrote(moment, format_string: str) -> str:
    return dateformat.format(timezone.localtime(moment), format_string)


@pytest.fixture
def page_events(tenant: Tenant, admin_user: User, sandbox: Sandbox) -> None:
    run, _ = run_services.run_start(tenant=tenant, title="Refund", actor=AGENT)
    # No actor: the page names the producer instead.
    run_services.decision_record(tenant=tenant, run_id=run.pk, kind="refund", content={}, actor="")
    propose_in(run, BIG_REFUND, intent="refund-1", actor=AGENT)
    with transaction.atomic():
        admin_event_append(
            tenant=tenant,
            event_type="api_key.revoked",
            subject="api_key:key_1",
            payload={"name": "bot"},
            by=admin_user,
        )


@pytest.mark.usefixtures("page_events")
def test_each_row_says_what_its_event_says_in_the_current_time_zone(tenant: Tenant) -> None:
    # Not UTC, and not a whole hour from it: a time left unconverted would show.
    with timezone.override("Asia/Kolkata"):
        rows = audit_page(tenant=tenant, query=AuditQuery(), size=100).rows
        events = Event.objects.in_bulk([row["id"] for row in rows])
        assert any(not event.actor for event in events.values())
        for row in rows:
            if row.get("admin"):
                continue
            event = events[row["id"]]
            assert row["iso"] == as_the_template_wrote(event.occurred_at, "c")
            assert row["when"] == as_the_template_wrote(event.occurred_at, "Y-m-d H:i:s")
            assert row["person"] == (event.actor or event.producer)
            assert row["run_url"] == reverse("runs:detail", args=[event.run_id])
            ids = [event.tool_call_id, event.approval_id, event.decision_id]
            assert row["ids"] == "".join(f"<code>{i}</code> " for i in ids if i)
            assert (row["event_type"], row["seq"]) == (event.event_type, event.seq)


@pytest.mark.usefixtures("page_events")
def test_admin_rows_say_what_the_admin_event_says(tenant: Tenant) -> None:
    with timezone.override("Asia/Kolkata"):
        rows = audit_page(tenant=tenant, query=AuditQuery(), size=100).rows
    (row,) = [row for row in rows if row.get("admin")]
    admin = AdminEvent.objects.get(pk=row["id"])
    with timezone.override("Asia/Kolkata"):
        assert row["iso"] == as_the_template_wrote(admin.occurred_at, "c")
    assert (row["person"], row["subject"]) == (admin.actor, "api_key:key_1")
    assert row["in_words"] == "key bot (key_1) revoked"


@pytest.mark.usefixtures("page_events")
def test_the_page_shows_the_rows_newest_first_with_their_links(
    tenant: Tenant, admin_user: User
) -> None:
    content = logged_in(admin_user).get("/audit/").content.decode()
    newest_first = list(Event.objects.filter(tenant=tenant).order_by("-occurred_at", "-seq"))
    positions = [content.index(f'<code class="muted">{event.pk}</code>') for event in newest_first]
    assert positions == sorted(positions)
    for event in newest_first:
        assert f'href="/runs/{event.run_id}/#{event.pk}"' in content
    assert "key bot (key_1) revoked" in content


def test_what_people_and_agents_wrote_is_escaped(
    tenant: Tenant, admin_user: User, sandbox: Sandbox
) -> None:
    actor = 'api_key:<script>alert("x")</script>'
    run_services.run_start(tenant=tenant, title="Refund", actor=actor)
    content = logged_in(admin_user).get("/audit/").content.decode()
    assert "<script>alert" not in content
    assert "api_key:&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in content
