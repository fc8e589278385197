"""The approval page in a real browser, with a real Celery worker (issue #11, points 1 and 2):
the context panel read from the payment gateway, the warning about the same refund asked
twice, and an edit previewed as a diff, confirmed, and approved by a second person."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from runs.models import User
from tests.browser.conftest import log_in
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, approval_of, propose, wait_for
from tests.sandbox_process import Sandbox

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(agent: ApiClient, approver: User, bob: User, start_celery) -> ApiClient:
    start_celery("worker")
    return agent


def test_the_context_panel_and_the_duplicate_warning(
    browser: Browser, live_server, world: ApiClient, sandbox: Sandbox
) -> None:
    # order-003 has $1,500.00 captured; $100 went out at the gateway itself, and the agent
    # asks for the same $250 refund twice.
    sandbox.post("payments", "/refunds", {**BIG_REFUND, "amount_cents": 10000}, request_id="r-1")
    first = propose(world, BIG_REFUND, intent="first")
    second = approval_of(propose(world, BIG_REFUND, intent="second"))
    # An approver in New York sees New York times, named.
    page = browser.new_context(timezone_id="America/New_York").new_page()
    page.set_default_timeout(10_000)
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{second.pk}/")

    warning = page.locator("#duplicate-warning")
    expect(warning).to_contain_text("The same refund was asked for before.")
    expect(warning).to_contain_text(first["tool_call_id"])
    expect(warning).to_contain_text("identical arguments")

    panel = page.locator("#object-context")  # loaded after the page
    expect(panel).to_contain_text("Read from the payment gateway")
    facts = page.locator("#context-facts")
    expect(facts).to_contain_text("customer-003@example.com")
    expect(facts).to_contain_text(re.compile(r"Captured\s*\$1,500\.00"))
    expect(facts).to_contain_text(re.compile(r"Refunded so far\s*\$100\.00"))
    expect(facts).to_contain_text(re.compile(r"Pending or in flight here \(1 refund\)\s*\$250\.00"))
    expect(facts).to_contain_text(re.compile(r"Refundable now\s*\$1,150\.00"))
    # Times in the browser's zone, with its name; "just now" for what just happened.
    expect(page.locator("#object-context time[data-relative]")).to_have_text("just now")
    expect(page.locator(".facts time[data-local]").first).to_contain_text("EST")


def test_an_edit_is_previewed_as_a_diff_confirmed_and_approved_by_a_second_person(
    page: Page, browser: Browser, live_server, world: ApiClient, sandbox: Sandbox
) -> None:
    call = propose(world, BIG_REFUND)
    approval = approval_of(call)
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{approval.pk}/")

    page.get_by_text("Approve with edits").first.click()
    amount = page.get_by_label("Amount (USD)")
    expect(amount).to_have_value("250.00")
    amount.fill("12.345")
    page.get_by_role("button", name="Preview changes").click()
    expect(page.locator("#problem__amount_cents")).to_have_text("Type at most 2 decimals.")
    expect(page.get_by_label("Amount (USD)")).to_have_value("12.345")  # after the redirect

    page.get_by_label("Amount (USD)").fill("1200")
    page.get_by_label("Why you edit it").fill("charged twice")
    page.get_by_role("button", name="Preview changes").click()
    expect(page.locator("#edit-diff-sentence")).to_have_text("Amount $250.00 → $1,200.00")
    warnings = page.locator("#edit-warnings")
    expect(warnings).to_contain_text("The edit raises the amount from $250.00 to $1,200.00.")
    expect(warnings).to_contain_text("asks for 2 (now 1)")
    assert sandbox.ledger() == []  # nothing is saved by a preview
    page.get_by_role("button", name="Confirm and approve").click()
    expect(
        page.get_by_text("Approved with your edits — 1 of 2, waiting for a second approver.")
    ).to_be_visible()

    bob = browser.new_context().new_page()
    bob.set_default_timeout(10_000)
    log_in(bob, live_server.url, "bob", PASSWORD)
    bob.goto(f"{live_server.url}/approvals/{approval_of(call).pk}/")
    expect(bob.locator("#decided")).to_contain_text("alice changed Amount $250.00 → $1,200.00")
    expect(bob.locator("#decided")).to_contain_text("“charged twice”")
    bob.get_by_role("button", name="Approve", exact=True).click()
    expect(bob.get_by_text("Approved — the call is on its way.")).to_be_visible()
    wait_for(lambda: len(sandbox.ledger("payments")) == 1, 20, "the edited refund")
    assert sandbox.ledger("payments")[0]["payload"]["amount_cents"] == 120000
