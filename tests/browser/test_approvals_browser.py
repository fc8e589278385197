"""Approvers in a real browser, with a real Celery worker dispatching what they approve."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from approvals.models import Approval
from runs.models import User
from tests.browser.conftest import log_in
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, propose, wait_for
from tests.sandbox_process import Sandbox
from toolcalls import gate

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(agent: ApiClient, approver: User, bob: User, start_celery) -> ApiClient:
    """The agent, alice and bob to decide what it proposes, and a real worker to dispatch it."""
    start_celery("worker")
    return agent


def second_browser(browser: Browser, base_url: str, username: str) -> Page:
    page = browser.new_context().new_page()
    page.set_default_timeout(10_000)
    log_in(page, base_url, username, PASSWORD)
    return page


def test_an_approval_appears_is_approved_and_dispatched_and_stays_true(
    page: Page, browser: Browser, live_server, world: ApiClient, sandbox: Sandbox
) -> None:
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/")
    expect(page.get_by_text("Nothing waits for a decision")).to_be_visible()

    call = propose(world, BIG_REFUND)  # while alice watches the inbox

    row = page.get_by_role("link", name=re.compile(r"Refund \$250\.00 on order order-003"))
    expect(row).to_be_visible(timeout=10_000)
    expect(page.locator("#nav-approvals-count")).to_have_text("1")
    row.click()
    approval_url = page.url
    bob = second_browser(browser, live_server.url, "bob")
    bob.goto(approval_url)
    expect(bob.locator("#approval-banner")).to_contain_text("Waiting for approval")

    page.get_by_role("button", name="Approve", exact=True).click()

    banner = page.locator("#approval-banner")
    expect(banner).to_contain_text("Already decided: approved by alice")
    # The worker dispatched it, and the look at the order confirmed the refund.
    expect(banner).to_contain_text(re.compile("execution Completed"), timeout=20_000)
    expect(banner).to_contain_text(re.compile("Confirmed success", re.I), timeout=20_000)
    page.reload()
    expect(page.locator("#approval-banner")).to_contain_text("Already decided: approved by alice")
    expect(bob.locator("#approval-banner")).to_contain_text("Already decided", timeout=10_000)
    expect(bob.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    wait_for(lambda: len(sandbox.ledger("payments")) == 1, 10, "the refund")
    assert sandbox.ledger("payments")[0]["request_id"] == call["external_request_id"]


def test_a_rejection_needs_a_reason_and_nothing_is_sent(
    page: Page, live_server, world: ApiClient, sandbox: Sandbox
) -> None:
    call = propose(world, BIG_REFUND)
    approval = Approval.objects.get(tool_call_id=call["tool_call_id"])
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{approval.pk}/")
    page.get_by_role("button", name="Reject").click()
    expect(page.get_by_role("alert")).to_contain_text("Say why you reject it")
    page.get_by_label("Reason (required to reject)").fill("customer already refunded by phone")
    page.get_by_role("button", name="Reject").click()
    expect(page.locator("#approval-banner")).to_contain_text(
        "Already decided: rejected by alice: “customer already refunded by phone”"
    )
    expect(page.locator("#approval-banner")).to_contain_text("Rejected")
    assert sandbox.ledger() == []


def test_approve_with_edits_sends_the_edited_amount(
    page: Page, live_server, world: ApiClient, sandbox: Sandbox
) -> None:
    call = propose(world, BIG_REFUND)
    approval = Approval.objects.get(tool_call_id=call["tool_call_id"])
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{approval.pk}/")
    page.get_by_text("Approve with edits").first.click()
    page.get_by_label("Amount (USD)").fill("150")
    page.get_by_label("Why you edit it").fill("half is fair")
    page.get_by_role("button", name="Preview changes").click()
    expect(page.locator("#edit-diff-sentence")).to_have_text("Amount $250.00 → $150.00")
    page.get_by_role("button", name="Confirm and approve").click()
    expect(
        page.get_by_text("Approved with your edits — the edited arguments need no approval")
    ).to_be_visible()
    expect(page.locator("#approval-banner")).to_contain_text("Invalidated")
    wait_for(lambda: len(sandbox.ledger("payments")) == 1, 20, "the edited refund")
    assert sandbox.ledger("payments")[0]["payload"]["amount_cents"] == 15000


def test_an_expired_approval_shows_as_expired_and_cannot_be_approved(
    page: Page, live_server, world: ApiClient, sandbox: Sandbox
) -> None:
    call = propose(world, BIG_REFUND)
    approval = Approval.objects.get(tool_call_id=call["tool_call_id"])
    Approval.objects.filter(pk=approval.pk).update(expires_at="2020-01-01T00:00:00Z")
    gate.approvals_expire_due()
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{approval.pk}/")
    expect(page.locator("#approval-banner")).to_contain_text("Expired")
    expect(page.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
    assert sandbox.ledger() == []
