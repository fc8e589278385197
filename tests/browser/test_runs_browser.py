from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from runs import services
from runs.models import Tenant, User
from tests.browser.conftest import log_in
from tests.helpers import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_approver_logs_in_sees_the_runs_and_opens_one(
    page: Page, live_server, tenant: Tenant, approver: User
) -> None:
    run, _ = services.run_start(tenant=tenant, title="Refund order-001", actor="test")
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="refund_eligibility", content={"ok": True}, actor="t"
    )

    log_in(page, live_server.url, "alice", PASSWORD)
    # An approver lands on the inbox; the runs are one click away.
    expect(page.get_by_role("heading", name="Approvals")).to_be_visible()
    page.get_by_role("navigation").get_by_role("link", name="Runs").click()

    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    page.get_by_role("link", name=run.pk).click()
    expect(page.get_by_role("heading", name="Refund order-001")).to_be_visible()
    expect(page.locator(".timeline")).to_contain_text("run.started")
    expect(page.locator(".timeline")).to_contain_text("decision.recorded")
    expect(page.locator(".banner")).to_contain_text("Active")


def test_the_runs_list_shows_a_new_run_without_a_reload(
    page: Page, live_server, tenant: Tenant, viewer: User
) -> None:
    log_in(page, live_server.url, viewer.username, PASSWORD)
    expect(page.get_by_text("No runs yet")).to_be_visible()

    services.run_start(tenant=tenant, title="Arrived while watching", actor="test")

    expect(page.get_by_text("Arrived while watching")).to_be_visible(timeout=10_000)
