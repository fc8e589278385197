"""An admin at the unknowns desk, in a real browser, with a real worker doing the look-ups."""

from __future__ import annotations

import re

import pytest
from django.db import transaction
from playwright.sync_api import Page, expect

from runs.models import OutboxMessage, User
from tests.browser.conftest import log_in
from tests.celery_processes import flush_broker
from tests.helpers import PASSWORD, REFUND, ApiClient, propose, start_run, wait_for
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch, reconcile, writes
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def unknown_refund(agent: ApiClient, sandbox: Sandbox, amount: int, intent: str) -> ToolCall:
    """A refund the gateway made but whose answer was lost, and whose look-ups ran out."""
    run_id = start_run(agent, f"Refund {intent}")
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call_id = propose(agent, {**REFUND, "amount_cents": amount}, intent=intent, run_id=run_id)[
        "tool_call_id"
    ]
    dispatch.tool_call_dispatch(tool_call_id=call_id)
    with transaction.atomic():
        call = writes.tool_call_lock(call_id)
        reconcile.tool_call_hand_to_human(
            call=call, reason="look-ups exhausted", actor="system:reconciler"
        )
    return ToolCall.objects.get(pk=call_id)


def test_an_admin_resolves_unknowns_and_compensates(
    page: Page, live_server, agent: ApiClient, admin_user: User, sandbox: Sandbox, start_celery
) -> None:
    by_look_up = unknown_refund(agent, sandbox, 1100, "lost-1")
    by_evidence = unknown_refund(agent, sandbox, 1200, "lost-2")
    reserve_id = propose(
        agent,
        {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1, "order_id": "order-002"},
        capability="reserve-stock-v1",
        intent="reserve",
        run_id=start_run(agent, "Reserve a part"),
    )["tool_call_id"]
    run_due()  # the reservation completes and is verified in this thread
    # Automation has given up on the two refunds: nothing queued may resolve them by itself.
    OutboxMessage.objects.filter(done_at=None).update(done_at="2000-01-01T00:00:00Z")
    flush_broker()
    start_celery("worker")
    log_in(page, live_server.url, "olivia", PASSWORD)
    page.goto(f"{live_server.url}/desk/")
    rows = page.locator("#desk-rows tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text(by_look_up.pk)  # the longest wait first

    page.get_by_role("link", name="Handoff packet").first.click()
    expect(page.get_by_role("heading", name="Original request")).to_be_visible()
    page.get_by_role("button", name="Take this item").click()
    expect(page.locator("#owner")).to_contain_text("You have this item")
    page.get_by_role("button", name="Look up now").click()
    expect(page.locator("#packet-status")).to_contain_text(
        re.compile("is Completed"), timeout=20_000
    )
    # The look-up is listed, and the next step now says there is nothing left to do.
    expect(page.locator("#lookups")).to_contain_text("found (re_")
    expect(page.locator("#packet-status")).to_contain_text("Nothing to do: it happened")

    page.goto(f"{live_server.url}/desk/{by_evidence.pk}/")
    refund_id = sandbox.effects_for(by_evidence.external_request_id)[0]["resource_id"]
    page.get_by_label("External id at payments").fill(refund_id)
    page.get_by_label("Evidence", exact=True).fill("seen in the gateway's dashboard")
    page.get_by_role("button", name="Mark confirmed").click()
    expect(page.get_by_text("Marked confirmed.")).to_be_visible()
    expect(page.locator("#packet-status")).to_contain_text(refund_id)

    page.goto(f"{live_server.url}/desk/")
    expect(page.get_by_text("Nothing is unknown")).to_be_visible()

    page.goto(f"{live_server.url}/desk/{reserve_id}/")
    page.get_by_text("Compensate…").click()  # it asks first: compensating cannot be undone
    page.get_by_role("button", name=re.compile("Yes, compensate")).click()
    expect(page.get_by_text(re.compile("Compensating with tc_"))).to_be_visible()
    expect(page.get_by_text("Compensate…")).to_have_count(0)  # not offered once done
    expect(page.locator("#packet-status")).to_contain_text("Compensated", timeout=20_000)

    wait_for(lambda: len(sandbox.ledger()) == 4, 10, "the ledger")
    operations = sorted((e["operation"], e["request_id"]) for e in sandbox.ledger())
    reserve = ToolCall.objects.get(pk=reserve_id)
    release = ToolCall.objects.get(compensation_of=reserve)
    assert operations == sorted(
        [
            ("refund.create", by_look_up.external_request_id),
            ("refund.create", by_evidence.external_request_id),
            ("reservation.create", reserve.external_request_id),
            ("reservation.release", release.external_request_id),
        ]
    )
