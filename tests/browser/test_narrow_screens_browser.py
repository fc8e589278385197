"""Every console page works at phone width (390 px) without sideways scrolling, and the run
page's tool-call table fits a laptop's 1280 px."""

from __future__ import annotations

import pytest
from django.db import transaction
from playwright.sync_api import Browser, Page, expect

from approvals.policy_edits import PolicyDraft, policy_publish
from console.views.approval_edit import Preview
from runs.models import ApiKey, Run, Tenant, User
from runs.services import api_key_issue
from tests.browser.conftest import log_in
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, approval_of, propose, propose_in
from toolcalls import reconcile, writes
from toolcalls.webhook_models import Webhook

REFUND = "refund-order-v2"

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pages(agent: ApiClient, admin_user: User, run: Run, sandbox) -> list[str]:
    """A run with calls, an approval waiting, and an item on the desk: every page has rows."""
    approval = approval_of(propose(agent, BIG_REFUND))
    stuck = propose_in(run)
    with transaction.atomic():
        call = writes.tool_call_lock(stuck.pk)
        writes.tool_call_transition(call, "claim", actor="t", producer="t")
        reconcile.tool_call_hand_to_human(call=call, reason="look-ups exhausted", actor="t")
    return [
        "/runs/",
        f"/runs/{run.pk}/",
        f"/runs/{approval.run_id}/",
        "/approvals/",
        f"/approvals/{approval.pk}/",
        "/desk/",
        f"/desk/{stuck.pk}/",
        "/audit/",
        "/dashboard/",
        "/runs/run_nosuchrun/",
        "/policies/",
        "/policies/refund-order-v2/",
        "/policies/refund-order-v2/edit/",
        "/people/",
        "/channels/",
    ]


def overflow(page: Page) -> int:
    """How many pixels the page is wider than the window (0: nothing scrolls sideways)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def test_no_page_scrolls_sideways_at_390_px(browser: Browser, live_server, pages) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.goto(f"{live_server.url}/login/")
    assert overflow(page) <= 0, "/login/"
    log_in(page, live_server.url, "olivia", PASSWORD)
    wide = {}
    for path in pages:
        page.goto(f"{live_server.url}{path}")
        if (extra := overflow(page)) > 0:
            wide[path] = extra
    context.close()
    assert wide == {}


def test_the_run_page_fits_1280_px(browser: Browser, live_server, pages) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    log_in(page, live_server.url, "olivia", PASSWORD)
    for path in pages[1:3]:
        page.goto(f"{live_server.url}{path}")
        assert overflow(page) <= 0, path
    context.close()


LONG_REASON = "the customer sent photographs of every damaged item in the parcel, twice"


@pytest.fixture
def todays_pages(agent: ApiClient, admin_user: User, tenant: Tenant, sandbox) -> dict[str, str]:
    """The pages added for the approver's and the admin's console, with long words in them:
    an edit's confirm page, a policy with two versions (a diff) and a long condition, a chat
    channel with a long webhook URL, a key with many scopes."""
    approval = approval_of(propose(agent, {**BIG_REFUND, "reason": LONG_REASON}))
    preview = Preview(
        approval.pk, approval.version, approval.summary_hash, {"amount_cents": 120000}, LONG_REASON
    )
    long_rule = {
        "name": "large refunds in euros or pounds for the marketplace orders",
        "when": 'amount_cents > 50000 and (currency == "EUR" or currency == "GBP")',
        "approvers": 2,
        "risk": "high",
    }
    policy_publish(
        tenant=tenant,
        capability_id=REFUND,
        draft=PolicyDraft(rules=[long_rule], escalation_group="finance-leads@example.com"),
        based_on=1,
        by=admin_user,
    )
    Webhook.objects.create(
        tenant=tenant,
        kind=Webhook.Kind.SLACK,
        url="https://hooks.slack.com/services/T0AAAAAAAAA/B0BBBBBBBBB/" + "x" * 48,
        event_types=list(Webhook.CHAT_EVENT_TYPES),
    )
    api_key_issue(
        tenant=tenant,
        name="refund-agent-of-the-marketplace-team",
        scopes=["payments.refund", "stock.*", "create-waybill-v1"],
        by=admin_user,
    )
    return {
        "approval": f"/approvals/{approval.pk}/",
        "confirm": f"/approvals/{approval.pk}/edit/confirm/?t={preview.token()}",
        "policies": "/policies/",
        "policy": f"/policies/{REFUND}/",
        "edit": f"/policies/{REFUND}/edit/",
        "channels": "/channels/",
        "people": "/people/",
        # The policy published and the key issued above, as admin events among run events.
        "audit": "/audit/",
    }


def sticking_out(page: Page) -> list[str]:
    """The innermost elements past the window's right edge: what a failure should name."""
    return page.evaluate(
        """[...document.querySelectorAll('main *')]
          .filter(e => e.getBoundingClientRect().right > window.innerWidth)
          .slice(-4).map(e => `${e.tagName}.${e.className}: ${e.textContent.slice(0, 50)}`)"""
    )


def test_todays_pages_do_not_scroll_sideways_at_390_px(
    browser: Browser, live_server, todays_pages: dict[str, str]
) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    log_in(page, live_server.url, "olivia", PASSWORD)
    wide = {}

    def check(what: str) -> None:
        if (extra := overflow(page)) > 0:
            wide[what] = (extra, sticking_out(page))

    for name, path in todays_pages.items():
        page.goto(f"{live_server.url}{path}")
        check(name)
        if name == "audit":
            published = page.locator("tr.admin-event", has_text="policy.published")
            expect(published).to_be_visible()
    # The approval page with its context fragment loaded (it comes after the page).
    page.goto(f"{live_server.url}{todays_pages['approval']}")
    expect(page.locator("#object-context:not([aria-busy])")).to_be_visible(timeout=15_000)
    expect(page.locator("#object-context h2")).to_contain_text("order-003")
    check("approval with its context")
    # Who acted is one long word ("api_key:key_01M8…"): it wraps instead of widening the page.
    page.evaluate(
        "document.querySelector('.timeline .muted').textContent = 'by api_key:' + 'k'.repeat(80)"
    )
    check("approval history with a long actor")
    # The confirm page says what the edit changes.
    page.goto(f"{live_server.url}{todays_pages['confirm']}")
    expect(page.get_by_text("$1,200.00").first).to_be_visible()
    check("confirm")
    # The editor with a row added and a rule tried.
    page.goto(f"{live_server.url}{todays_pages['edit']}")
    page.get_by_role("button", name="Add a rule").click()
    expect(page.get_by_label("Rule 3: Name")).to_be_visible()
    check("edit with a rule added")
    page.get_by_role("button", name="Try this rule").click()
    expect(page.locator("#try-draft")).to_be_visible(timeout=15_000)
    check("edit with a rule tried")
    # A key just issued: its token is shown once, in full.
    page.goto(f"{live_server.url}{todays_pages['people']}")
    page.locator("#key-name").fill("a-second-agent-with-a-long-name")
    page.locator("#key-scopes").fill("payments.refund, stock.*")
    page.get_by_role("button", name="Issue key").click()
    expect(page.locator("#issued-key")).to_be_visible()
    check("people with a key issued")
    # Refreshing the page the issue redirected to issues no second key and hides the token.
    page.reload()
    expect(page.locator("#issued-key")).to_have_count(0)
    assert ApiKey.objects.filter(name="a-second-agent-with-a-long-name").count() == 1
    context.close()
    assert wide == {}
