"""Every console page works at phone width (390 px) without sideways scrolling, and the run
page's tool-call table fits a laptop's 1280 px."""

from __future__ import annotations

import pytest
from django.db import transaction
from playwright.sync_api import Browser, Page

from runs.models import Run, User
from tests.browser.conftest import log_in
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, approval_of, propose, propose_in
from toolcalls import reconcile, writes

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
