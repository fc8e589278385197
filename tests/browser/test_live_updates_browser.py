"""Live regions refresh by morphing: what has focus stays focused, and changes are announced."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from runs.models import User
from tests.browser.conftest import log_in
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, approval_of, decide, logged_in, propose

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_focus_stays_on_the_row_it_was_on_when_the_inbox_refreshes(
    page: Page, live_server, agent: ApiClient, approver: User, sandbox
) -> None:
    propose(agent, {**BIG_REFUND, "amount_cents": 24000}, intent="first")
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/")
    first = page.get_by_role("link", name=re.compile(r"Refund \$240\.00"))
    first.focus()
    # A refund that expires no sooner arrives below it while alice's focus is on the first.
    propose(agent, {**BIG_REFUND, "amount_cents": 23000}, intent="second")
    expect(page.get_by_role("link", name=re.compile(r"Refund \$230\.00"))).to_be_visible(
        timeout=10_000
    )
    focused = page.evaluate("[document.activeElement.tagName, document.activeElement.textContent]")
    assert focused[0] == "A" and "Refund $240.00" in focused[1]  # the row kept its focus


def test_a_decision_made_elsewhere_is_announced(
    page: Page, live_server, agent: ApiClient, approver: User, bob: User, sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    log_in(page, live_server.url, "bob", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{approval.pk}/")
    expect(page.locator("#approval-banner")).to_contain_text("Waiting for approval")

    decide(logged_in(approver), approval, "reject", reason="customer called back")

    expect(page.locator("#banner-status")).to_have_text("Rejected by alice.", timeout=10_000)
    expect(page.locator("#approval-banner")).to_contain_text("Already decided: rejected")
    # The skip link leads past the navigation to the page's content.
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()


def test_a_double_click_on_approve_sends_one_decision(
    page: Page, live_server, agent: ApiClient, approver: User, sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    log_in(page, live_server.url, "alice", PASSWORD)
    page.goto(f"{live_server.url}/approvals/{approval.pk}/")
    posts = []
    page.on("request", lambda request: posts.append(request) if request.method == "POST" else None)
    # Two clicks as an impatient person makes them: the second lands before the page changed.
    page.get_by_role("button", name="Approve", exact=True).evaluate(
        "button => { button.click(); setTimeout(() => button.click(), 50); }"
    )
    expect(page.locator("#approval-banner")).to_contain_text("Already decided: approved by alice")
    expect(page.locator(".refusal")).to_have_count(0)  # no error after her own success
    assert approval.decisions.count() == 1
    assert len(posts) == 1
