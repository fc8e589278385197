"""The unknowns desk: what it lists, the handoff packet, and commands that never double."""

from __future__ import annotations

import pytest
from django.test import Client

from console.views import desk as desk_views
from runs.models import Event, Run, Tenant, User
from runs.services import run_start
from tests.helpers import (
    REFUND,
    ApiClient,
    consistency_window,
    logged_in,
    make_user,
    propose,
    propose_in,
    start_run,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch, reconcile, writes
from toolcalls.models import Receipt, ToolCall


@pytest.fixture
def admin(admin_user: User) -> Client:
    return logged_in(admin_user)


def unknown_call(
    agent: ApiClient,
    sandbox: Sandbox,
    fault: str = "drop_response_after_commit",
    args: dict = REFUND,
    intent: str = "i-1",
) -> ToolCall:
    """A refund sent once, whose answer was lost (or whose request never arrived)."""
    sandbox.faults(system="payments", times=1, **{fault: 1.0})
    call_id = propose(agent, args, intent=intent)["tool_call_id"]
    dispatch.tool_call_dispatch(tool_call_id=call_id)
    call = ToolCall.objects.get(pk=call_id)
    assert call.execution_status == "result_unknown"
    return call


def to_needs_human(call: ToolCall) -> None:
    from django.db import transaction

    with transaction.atomic():
        locked = writes.tool_call_lock(call.pk)
        reconcile.tool_call_hand_to_human(
            call=locked, reason="look-ups exhausted", actor="system:test"
        )


def command(client: Client, call: ToolCall, action: str, **fields):
    # One URL per command: look-up, confirm, not-happened, retry, compensate, abandon.
    return client.post(f"/desk/{call.pk}/{action.replace('_', '-')}/", fields)


def test_it_lists_what_automation_could_not_settle(
    admin: Client, agent: ApiClient, tenant: Tenant, sandbox: Sandbox
) -> None:
    older = unknown_call(agent, sandbox, intent="older")
    newer = unknown_call(agent, sandbox, args={**REFUND, "amount_cents": 100}, intent="newer")
    to_needs_human(newer)
    stuck = start_run(agent, "stuck")
    stuck_call = propose(
        agent, {"order_id": "order-001"}, capability="get-order-v1", intent="read", run_id=stuck
    )["tool_call_id"]
    dispatch.tool_call_claim(tool_call_id=stuck_call, outbox_id=None, worker="dead-worker")
    ToolCall.objects.filter(pk=stuck_call).update(lease_expires_at="2000-01-01T00:00:00Z")
    page = admin.get("/desk/").content.decode()
    assert page.index(older.pk) < page.index(newer.pk)  # longest dwell first
    assert "needs_human" in page and "lease_expired" in page and stuck_call in page
    partial = admin.get("/desk/", headers={"HX-Request": "true"}).content.decode()
    assert older.pk in partial and "<html" not in partial


def test_the_desk_is_for_admins_of_the_tenant(
    agent: ApiClient, approver: User, other_tenant: Tenant, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    client = logged_in(approver)
    assert client.get("/desk/").status_code == 403
    assert command(client, call, "abandon", evidence="x").status_code == 403
    outsider = logged_in(make_user("mallory", other_tenant, User.Role.ADMIN))
    assert outsider.get(f"/desk/{call.pk}/").status_code == 404
    assert command(outsider, call, "abandon", evidence="x").status_code == 404
    assert ToolCall.objects.get(pk=call.pk).execution_status == "result_unknown"


def test_the_handoff_packet_has_what_a_person_needs(
    admin: Client, agent: ApiClient, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    page = admin.get(f"/desk/{call.pk}/").content.decode()
    for expected in (
        "Original request",
        call.idempotency_key,
        call.external_request_id,
        "Confirmed actions of the run",
        "Unknown actions",
        "Receipts",
        "Approvals",
        "Look it up now at payments",
        "tool.connection_lost",
    ):
        assert expected in page, expected


def test_look_up_now_confirms_what_happened(admin: Client, agent, sandbox: Sandbox) -> None:
    call = unknown_call(agent, sandbox)
    to_needs_human(call)
    assert command(admin, call, "look_up").status_code == 302
    run_due()
    call = ToolCall.objects.get(pk=call.pk)
    assert call.execution_status == "completed"
    assert call.receipts.get().source == Receipt.Source.LOOKUP
    assert Run.objects.get(pk=call.run_id).state == "active"
    assert len(sandbox.ledger("payments")) == 1


def test_mark_confirmed_needs_the_id_the_system_knows(
    admin: Client, agent: ApiClient, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    refund_id = sandbox.effects_for(call.external_request_id)[0]["resource_id"]
    wrong = command(admin, call, "confirm", external_id="re_made_up", evidence="phone call")
    assert wrong.status_code == 409
    assert refund_id in wrong.content.decode()
    assert (
        command(
            admin, call, "confirm", external_id=refund_id, evidence="seen in the gateway dashboard"
        ).status_code
        == 302
    )
    call = ToolCall.objects.get(pk=call.pk)
    assert (call.execution_status, call.external_id) == ("completed", refund_id)
    receipt = call.receipts.get()
    assert receipt.source == Receipt.Source.PERSON
    accepted = call.run.events.get(event_type="tool_call.accepted")
    assert accepted.actor == "user:olivia"
    assert accepted.payload["evidence"] == "seen in the gateway dashboard"
    assert len(sandbox.ledger("payments")) == 1


def test_it_will_not_mark_as_not_happened_what_happened(admin, agent, sandbox) -> None:
    call = unknown_call(agent, sandbox)
    response = command(admin, call, "not_happened", evidence="I think not")
    assert response.status_code == 409
    assert "confirm it instead" in response.content.decode()
    assert ToolCall.objects.get(pk=call.pk).execution_status == "result_unknown"


def test_not_happened_then_retry_with_the_same_key(
    admin: Client, agent, sandbox, monkeypatch
) -> None:
    call = unknown_call(agent, sandbox, fault="drop_request_before_commit")
    early = command(admin, call, "not_happened", evidence="not in the gateway")
    assert early.status_code == 409  # the look-up may still lag
    consistency_window(monkeypatch, "refund-order-v2", 0)  # now it may not
    assert command(admin, call, "not_happened", evidence="not in the gateway").status_code == 302
    call = ToolCall.objects.get(pk=call.pk)
    assert (call.execution_status, call.last_error_name) == ("failed", "tool.did_not_happen")
    assert command(admin, call, "retry").status_code == 302
    run_due()
    call = ToolCall.objects.get(pk=call.pk)
    assert call.execution_status == "completed"
    effects = sandbox.effects_for(call.external_request_id)
    assert len(effects) == 1 and effects[0]["idempotency_key"] == call.idempotency_key


def test_abandon_needs_a_reason_and_ends_the_call(admin: Client, agent, sandbox) -> None:
    call = unknown_call(agent, sandbox)
    assert command(admin, call, "abandon", evidence="").status_code == 422
    assert (
        command(admin, call, "abandon", evidence="customer cancelled the order").status_code == 302
    )
    call = ToolCall.objects.get(pk=call.pk)
    assert (call.execution_status, call.last_error_name) == ("failed", "tool.abandoned")
    retry = agent.post(f"/api/v1/tool-calls/{call.pk}/retry")
    assert retry.status_code == 409


def test_a_run_handed_over_without_unknowns_can_be_resumed(admin: Client, tenant) -> None:
    run, _ = run_start(tenant=tenant, title="expired approval", actor="t")
    from django.db import transaction

    from runs.services import run_transition

    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        run_transition(locked, "hand_to_human", actor="t", producer="t", reason="expired")
    assert "expired approval" in admin.get("/desk/").content.decode()
    response = admin.post(f"/desk/runs/{run.pk}/resume/", {"evidence": "customer called back"})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).state == "active"


def test_after_a_look_up_the_packet_lists_it_and_suggests_nothing_more(
    admin: Client, agent, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    before = admin.get(f"/desk/{call.pk}/").content.decode()
    assert "Look it up now at payments" in before and "None yet." in before
    command(admin, call, "look_up")
    run_due()
    page = admin.get(f"/desk/{call.pk}/").content.decode()
    assert "#1" in page and "found (re_" in page
    assert "Nothing to do: it happened and is confirmed" in page
    assert "last error" not in page  # the timeout that sent it here is no longer current


def test_an_admin_takes_an_item_and_the_others_see_who_has_it(
    admin: Client, admin_user: User, tenant: Tenant, agent, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    assert command(admin, call, "claim").status_code == 302
    other = logged_in(make_user("oscar", tenant, User.Role.ADMIN))
    assert "olivia has it" in other.get("/desk/").content.decode()
    assert "Take it over from olivia" in other.get(f"/desk/{call.pk}/").content.decode()
    command(other, call, "claim")
    call.refresh_from_db()
    assert call.desk_owner.username == "oscar"
    claims = Event.objects.filter(tool_call_id=call.pk, event_type="tool_call.desk_claimed")
    assert [e.payload for e in claims.order_by("seq")] == [
        {"by": "olivia"},
        {"by": "oscar", "from": "olivia"},
    ]


def test_during_an_outage_every_unknown_at_one_system_is_looked_up_at_once(
    admin: Client, agent, sandbox: Sandbox
) -> None:
    calls = [unknown_call(agent, sandbox, intent=f"i-{n}") for n in range(3)]
    page = admin.get("/desk/").content.decode()
    assert "Look up all 3 at payments" in page
    response = admin.post("/desk/systems/payments/look-up/", follow=True)
    assert "Looking up 3 unknown calls at payments now." in response.content.decode()
    run_due()
    assert {ToolCall.objects.get(pk=c.pk).execution_status for c in calls} == {"completed"}
    assert len(sandbox.ledger("payments")) == 3


def test_compensate_and_abandon_ask_first_and_compensate_is_gone_once_done(
    admin: Client, agent, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    page = admin.get(f"/desk/{call.pk}/").content.decode()
    assert "<summary>Abandon…</summary>" in page and "Yes, abandon it" in page
    reserve = propose(
        agent,
        {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1, "order_id": "order-002"},
        capability="reserve-stock-v1",
        intent="reserve",
    )
    run_due()
    page = admin.get(f"/desk/{reserve['tool_call_id']}/").content.decode()
    assert "<summary>Compensate…</summary>" in page
    reserved = ToolCall.objects.get(pk=reserve["tool_call_id"])
    assert command(admin, reserved, "compensate").status_code == 302
    page = admin.get(f"/desk/{reserved.pk}/").content.decode()
    assert "Compensate…" not in page


def test_the_desk_shows_the_longest_waits_and_counts_the_rest(
    admin_user: User, run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(desk_views, "DESK_ROWS", 2)
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=3)
    calls = [propose_in(run, {**REFUND, "amount_cents": 100 + n}, intent=f"u{n}") for n in range(3)]
    for call in calls:
        dispatch.tool_call_dispatch(tool_call_id=call.pk)
    page = logged_in(admin_user).get("/desk/").content.decode()
    assert calls[0].pk in page and calls[1].pk in page and calls[2].pk not in page
    assert "And 1 more, waiting less long" in page
    assert "Look up all 3 at payments" in page


def test_each_transition_stamps_when_the_call_entered_its_status(agent, sandbox) -> None:
    call = unknown_call(agent, sandbox)
    to_needs_human(call)
    call.refresh_from_db()
    moves = list(Event.objects.filter(tool_call_id=call.pk).order_by("seq"))
    entered = next(e for e in reversed(moves) if e.event_type == "tool_call.needs_human")
    before = moves[moves.index(entered) - 1]
    # Stamped with its event, in the same transaction.
    assert before.occurred_at < call.status_since == entered.occurred_at


def test_the_desk_orders_by_the_stored_time_not_by_the_events(
    admin: Client, agent: ApiClient, sandbox: Sandbox
) -> None:
    first = unknown_call(agent, sandbox, intent="first")
    second = unknown_call(agent, sandbox, args={**REFUND, "amount_cents": 100}, intent="second")
    ToolCall.objects.filter(pk=first.pk).update(status_since=second.status_since)
    ToolCall.objects.filter(pk=second.pk).update(status_since="2000-01-01T00:00:00Z")
    page = admin.get("/desk/").content.decode()
    assert page.index(second.pk) < page.index(first.pk)
