"""The audit trail: a tenant's events by any id, person, type or time; the page; the export."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.models import Approval
from console import audit
from console.audit import AuditQuery, audit_events, audit_query_from
from runs import events
from runs import services as run_services
from runs.models import Decision, Event, Run, Tenant, User
from tests.helpers import BIG_REFUND, logged_in, propose_in
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import gate
from toolcalls.models import ToolCall

AGENT = "api_key:key_agent0001"


@dataclass
class Story:
    """A refund as it happens: a decision, a call over $200, alice approves, it completes."""

    run: Run
    decision: Decision
    call: ToolCall
    approval: Approval


@pytest.fixture
def story(tenant: Tenant, approver: User, sandbox: Sandbox) -> Story:
    run, _ = run_services.run_start(
        tenant=tenant, title="Refund order-003", actor=AGENT, correlation_id="ticket-4711"
    )
    decision = run_services.decision_record(
        tenant=tenant, run_id=run.pk, kind="refund_amount", content={"cents": 25000}, actor=AGENT
    )
    call = propose_in(run, BIG_REFUND, intent="refund-1", actor=AGENT, decision_id=decision.pk)
    approval = Approval.objects.get(tool_call=call)
    gate.tool_call_approve(
        tenant=tenant,
        approval_id=approval.pk,
        user=approver,
        seen_version=approval.version,
        seen_summary_hash=approval.summary_hash,
    )
    run_due()
    call.refresh_from_db()
    assert call.verification_status == "confirmed_success"
    return Story(run=run, decision=decision, call=call, approval=approval)


@pytest.fixture
def globex_run(other_tenant: Tenant) -> Run:
    """Another tenant's run with the same correlation id and a person of the same name."""
    run, _ = run_services.run_start(
        tenant=other_tenant, title="Globex secret", actor="user:alice", correlation_id="ticket-4711"
    )
    return run


def search(tenant: Tenant, **params: str) -> list[Event]:
    query, errors = audit_query_from(params)
    assert errors == {}
    return list(audit_events(tenant=tenant, query=query))


def with_causation(run: Run, cause: Event) -> Event:
    # An event naming its cause explicitly; the audit must find it.
    with transaction.atomic():
        return events.append(
            run=run,
            event_type="decision.recorded",
            payload={"kind": "note", "version": 1, "content": {}, "supersedes": None},
            producer="test",
            actor=AGENT,
            ids=events.Ids(causation_id=cause.pk),
        )


# --- search ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value_of"),
    [
        ("run_id", lambda s: s.run.pk),
        ("tool_call_id", lambda s: s.call.pk),
        ("approval_id", lambda s: s.approval.pk),
        ("decision_id", lambda s: s.decision.pk),
        ("capability_id", lambda s: "refund-order-v2"),
        ("correlation_id", lambda s: "ticket-4711"),
    ],
)
def test_it_finds_every_event_that_carries_an_id_and_only_those(
    story: Story, tenant: Tenant, globex_run: Run, field: str, value_of
) -> None:
    value = value_of(story)
    found = search(tenant, q=value)
    assert found
    assert all(getattr(event, field) == value for event in found)
    carrying = Event.objects.filter(tenant=tenant, **{field: value})
    assert {event.pk for event in found} == set(carrying.values_list("pk", flat=True))


def test_it_finds_one_event_by_its_own_id(story: Story, tenant: Tenant) -> None:
    event = story.run.events.get(seq=1)
    assert search(tenant, q=event.pk) == [event]


def test_it_finds_an_event_by_the_event_that_caused_it(story: Story, tenant: Tenant) -> None:
    cause = story.run.events.get(event_type="approval.approved")
    effect = with_causation(story.run, cause)
    caused = set(Event.objects.filter(causation_id=cause.pk).values_list("pk", flat=True))
    assert effect.pk in caused
    assert {event.pk for event in search(tenant, q=cause.pk)} == {cause.pk, *caused}


def test_it_finds_events_by_the_ids_their_payload_names(story: Story, tenant: Tenant) -> None:
    attempt = story.call.attempts.get()
    receipt = story.call.receipts.get()
    accepted = story.run.events.get(event_type="tool_call.accepted")
    assert accepted in search(tenant, q=story.call.external_id)
    assert accepted in search(tenant, q=receipt.pk)
    assert search(tenant, q=attempt.pk)
    assert all(e.payload.get("attempt_id") == attempt.pk for e in search(tenant, q=attempt.pk))


def test_a_name_finds_the_persons_events(story: Story, tenant: Tenant, globex_run: Run) -> None:
    found = search(tenant, person="alice")
    assert {event.actor for event in found} == {"user:alice"}
    assert {"approval.decision_recorded", "approval.approved"} <= {e.event_type for e in found}
    assert search(tenant, person="user:alice") == found
    assert search(tenant, person="ALICE") == found


def test_part_of_a_name_finds_nobody(story: Story, tenant: Tenant) -> None:
    assert search(tenant, person="ali") == []


def test_an_api_key_and_a_system_component_are_people_too(story: Story, tenant: Tenant) -> None:
    by_key = search(tenant, person="key_agent0001")
    assert by_key
    assert {event.actor for event in by_key} == {AGENT}
    by_dispatcher = search(tenant, person="dispatcher")
    assert "tool_call.accepted" in {event.event_type for event in by_dispatcher}
    assert {event.actor for event in by_dispatcher} == {"system:dispatcher"}


def test_a_type_prefix_finds_every_type_under_it(story: Story, tenant: Tenant) -> None:
    found = search(tenant, type="approval.")
    types = {event.event_type for event in found}
    assert {"approval.required", "approval.decision_recorded", "approval.approved"} <= types
    assert all(t.startswith("approval.") for t in types)
    assert search(tenant, type="approval") == found


def test_an_exact_type_finds_only_that_type(story: Story, tenant: Tenant) -> None:
    found = search(tenant, type="tool_call.accepted")
    assert [event.event_type for event in found] == ["tool_call.accepted"]


def test_filters_combine(story: Story, tenant: Tenant) -> None:
    found = search(tenant, q=story.call.pk, person="alice", type="tool_call.")
    assert [event.event_type for event in found] == ["tool_call.authorized"]


def test_a_time_range_keeps_what_happened_inside_it(tenant: Tenant) -> None:
    early, _ = run_services.run_start(tenant=tenant, title="early", actor=AGENT)
    middle = timezone.now()
    late, _ = run_services.run_start(tenant=tenant, title="late", actor=AGENT)
    assert {e.run_id for e in search(tenant, **{"from": middle.isoformat()})} == {late.pk}
    assert {e.run_id for e in search(tenant, to=middle.isoformat())} == {early.pk}


def test_a_date_range_covers_whole_days(story: Story, tenant: Tenant) -> None:
    today = timezone.localdate()
    yesterday = (today - timedelta(days=1)).isoformat()
    everything = search(tenant)
    assert search(tenant, **{"from": today.isoformat(), "to": today.isoformat()}) == everything
    assert search(tenant, to=yesterday) == []
    assert search(tenant, **{"from": (today + timedelta(days=1)).isoformat()}) == []


def test_results_are_newest_first(story: Story, tenant: Tenant) -> None:
    times = [event.occurred_at for event in search(tenant)]
    assert times == sorted(times, reverse=True)


def test_an_unreadable_time_is_reported_not_ignored() -> None:
    query, errors = audit_query_from({"from": "last tuesday", "to": "2025-01-31"})
    assert set(errors) == {"from"}
    assert "ISO 8601" in errors["from"]
    assert query.occurred_to == datetime(2025, 1, 31, 23, 59, 59, 999999, tzinfo=UTC)


def test_another_tenants_events_never_appear(
    story: Story, tenant: Tenant, other_tenant: Tenant, globex_run: Run
) -> None:
    everything = audit_events(tenant=tenant, query=AuditQuery())
    assert not everything.filter(tenant=other_tenant).exists()
    assert search(tenant, q=globex_run.pk) == []
    assert {e.run_id for e in search(tenant, q="ticket-4711")} == {story.run.pk}


# --- the page -------------------------------------------------------------------------------


def test_the_page_links_each_event_to_its_place_on_the_run_page(
    story: Story, admin_user: User
) -> None:
    response = logged_in(admin_user).get("/audit/", {"q": story.call.pk})
    assert response.status_code == 200
    content = response.content.decode()
    for event in story.run.events.filter(tool_call_id=story.call.pk):
        assert f'href="/runs/{story.run.pk}/#{event.pk}"' in content


def test_the_page_shows_100_events_at_a_time(tenant: Tenant, admin_user: User) -> None:
    run, _ = run_services.run_start(tenant=tenant, title="busy", actor=AGENT)
    for n in range(120):
        run_services.decision_record(
            tenant=tenant, run_id=run.pk, kind=f"step-{n}", content={}, actor=AGENT
        )
    client = logged_in(admin_user)
    first = client.get("/audit/", {"q": run.pk})
    assert len(first.context["events"]) == 100
    older = first.context["older"]
    assert f"before={quote(older)}" in first.content.decode()
    second = client.get("/audit/", {"q": run.pk, "before": older})
    assert len(second.context["events"]) == 21
    assert second.context["older"] == ""
    assert "Newest" in second.content.decode()
    seen = {e["id"] for e in first.context["events"]} | {e["id"] for e in second.context["events"]}
    assert len(seen) == 121


def test_a_damaged_page_link_shows_nothing_and_says_so(admin_user: User) -> None:
    response = logged_in(admin_user).get("/audit/", {"before": "yesterday~run_x~1"})
    assert response.status_code == 200
    assert response.context["events"] == []
    assert "This page link is damaged" in response.content.decode()


def test_the_page_says_what_it_cannot_read(admin_user: User) -> None:
    response = logged_in(admin_user).get("/audit/", {"to": "soon"})
    assert response.status_code == 200
    assert "is not an ISO 8601 date" in response.content.decode()


def test_people_who_are_not_admins_are_refused(story: Story, approver: User, viewer: User):
    for user in (approver, viewer):
        assert logged_in(user).get("/audit/").status_code == 403
        assert logged_in(user).get("/audit/export/").status_code == 403


def test_anonymous_visitors_are_sent_to_login(client: Client) -> None:
    for url in ("/audit/", "/audit/export/"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")


# --- the export -----------------------------------------------------------------------------


def export(user: User, **params: str) -> tuple[object, list[dict]]:
    response = logged_in(user).get("/audit/export/", params)
    assert response.status_code == 200
    body = b"".join(response.streaming_content).decode()
    assert body.endswith("\n")
    return response, [json.loads(line) for line in body.splitlines()]


def test_the_export_is_json_lines_of_what_the_search_finds(
    story: Story, tenant: Tenant, admin_user: User, globex_run: Run
) -> None:
    response, lines = export(admin_user, type="approval.")
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"].startswith('attachment; filename="audit-acme-')
    assert response["Content-Disposition"].endswith('.jsonl"')
    assert [line["id"] for line in lines] == [e.pk for e in search(tenant, type="approval.")]


def test_each_exported_line_holds_the_whole_event(story: Story, admin_user: User) -> None:
    _, lines = export(admin_user, q=story.call.pk, type="tool_call.accepted")
    [line] = lines
    event = Event.objects.get(pk=line["id"])
    assert line["run_id"] == story.run.pk
    assert line["seq"] == event.seq
    assert (line["hash"], line["prev_hash"]) == (event.hash, event.prev_hash)
    assert line["payload"] == event.payload
    assert line["payload"]["external_id"] == story.call.external_id
    assert line["actor"] == "system:dispatcher"
    assert datetime.fromisoformat(line["occurred_at"]) == event.occurred_at
    assert datetime.fromisoformat(line["recorded_at"]) == event.recorded_at
    assert line["occurred_at"].endswith("+00:00")


def test_the_export_leaves_other_tenants_out(
    story: Story, admin_user: User, globex_run: Run
) -> None:
    _, lines = export(admin_user)
    assert lines
    assert {line["tenant_id"] for line in lines} == {story.run.tenant_id}
    assert globex_run.pk not in {line["run_id"] for line in lines}


def test_an_export_it_cannot_read_is_a_bad_request(admin_user: User) -> None:
    response = logged_in(admin_user).get("/audit/export/", {"from": "yesterday-ish"})
    assert response.status_code == 400


def test_the_export_reads_chunk_after_chunk_without_losing_or_repeating_one(
    tenant: Tenant, admin_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "EXPORT_CHUNK_SIZE", 7)
    run, _ = run_services.run_start(tenant=tenant, title="busy", actor=AGENT)
    for n in range(20):
        run_services.decision_record(
            tenant=tenant, run_id=run.pk, kind=f"step-{n}", content={}, actor=AGENT
        )
    response = logged_in(admin_user).get("/audit/export/", {"q": run.pk})
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [line["seq"] for line in lines] == list(range(21, 0, -1))
