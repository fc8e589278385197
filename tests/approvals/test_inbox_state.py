"""The inbox's state (what its poll compares) is read by written-out SQL that reads what the
ORM's aggregate read; the navigation's count of pending approvals is read only by a page that
shows it, and once on the inbox's page, which reads that count already."""

from __future__ import annotations

import re
from datetime import timedelta

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import selectors
from approvals.models import Approval, ApprovalDecision
from runs.models import Run, Tenant, User
from tests.helpers import BIG_REFUND, logged_in, propose_in
from tests.sandbox_process import Sandbox

HTMX = {"HX-Request": "true"}


def _pending(run: Run, how_many: int) -> None:
    for n in range(how_many):
        propose_in(run, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"i{n}")


def test_the_inbox_state_reads_what_the_orm_reads(
    tenant: Tenant, other_tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    assert selectors.inbox_state(tenant=tenant) == selectors.inbox_state_orm(tenant=tenant)
    assert selectors.inbox_state(tenant=tenant).latest is None
    _pending(run, 3)
    # One no longer pending, changed after the others: neither its count nor its time is the
    # state's.
    first = Approval.objects.filter(tenant=tenant).order_by("id").first()
    later = timezone.now() + timedelta(hours=1)
    Approval.objects.filter(pk=first.pk).update(state=Approval.State.EXPIRED, updated_at=later)
    state = selectors.inbox_state(tenant=tenant)
    assert state == selectors.inbox_state_orm(tenant=tenant)
    assert state.count == 2 and state.latest < later
    assert selectors.inbox_state(tenant=other_tenant) == selectors.inbox_state_orm(
        tenant=other_tenant
    )
    assert selectors.inbox_state(tenant=other_tenant).count == 0


def _counts(client: Client, path: str, headers: dict[str, str]) -> tuple[int, str]:
    """How many statements counted pending approvals, and the page."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, headers=headers)
    assert response.status_code == 200
    counted = [
        q["sql"]
        for q in captured.captured_queries
        if re.match(r"(?i)select count\(\*\).* FROM approvals_approval ", q["sql"])
    ]
    return len(counted), response.content.decode()


def _nav_count(page: str) -> str:
    return re.search(r'id="nav-approvals-count"[^>]*>(\d+)<', page).group(1)


def test_the_navigation_counts_pending_approvals_only_where_it_shows(
    run: Run, approver: User, sandbox: Sandbox
) -> None:
    _pending(run, 2)
    alice = logged_in(approver)
    alice.get("/runs/")  # the session and the person are read once, not counted
    counted, page = _counts(alice, "/runs/", {})
    assert (counted, _nav_count(page)) == (1, "2")
    # The inbox's page counts once, for its own list and the navigation both.
    counted, page = _counts(alice, "/approvals/", {})
    assert (counted, _nav_count(page)) == (1, "2")
    # Its poll swaps the count out of band from the same count; the approval banner's poll
    # has no navigation and counts nothing.
    counted, page = _counts(alice, "/approvals/", HTMX)
    assert (counted, _nav_count(page)) == (1, "2")
    approval = Approval.objects.filter(run=run).first()
    counted, page = _counts(alice, f"/approvals/{approval.pk}/", HTMX)
    assert counted == 0 and "nav-approvals-count" not in page


def test_a_page_of_the_inbox_reads_what_the_orm_reads(
    tenant: Tenant, other_tenant: Tenant, run: Run, approver: User, bob: User, sandbox: Sandbox
) -> None:
    _pending(run, 6)
    approvals = list(Approval.objects.filter(tenant=tenant).order_by("id"))
    # Ties on the time left, broken by risk and then id; one no longer pending.
    soon = timezone.now() + timedelta(minutes=30)
    for approval, risk in zip(approvals[:4], ("low", "high", "medium", "high"), strict=True):
        Approval.objects.filter(pk=approval.pk).update(expires_at=soon, risk=risk)
    Approval.objects.filter(pk=approvals[5].pk).update(state=Approval.State.EXPIRED)
    # Approvals so far count approvals, not rejections.
    for approval, user, kind in (
        (approvals[0], approver, "approve"),
        (approvals[0], bob, "approve"),
        (approvals[1], approver, "reject"),
        (approvals[2], bob, "approve"),
    ):
        ApprovalDecision.objects.create(
            approval=approval, user=user, decision=kind, summary_hash=approval.summary_hash
        )
    Run.objects.filter(pk=run.pk).update(title='Refunds <& "notices">')
    for offset, limit in ((0, 51), (0, 2), (2, 2), (4, 51), (9, 5)):
        page = selectors.inbox_page(tenant=tenant, offset=offset, limit=limit)
        assert page == selectors.inbox_page_orm(tenant=tenant, offset=offset, limit=limit)
    page = selectors.inbox_page(tenant=tenant, offset=0, limit=51)
    assert [row.risk for row in page[:4]] == ["high", "high", "medium", "low"]
    assert {row.id: row.approvals_so_far for row in page}[approvals[0].pk] == 2
    assert len(page) == 5 and (page[0].id, page[0].args) == (approvals[1].pk, approvals[1].args)
    assert selectors.inbox_page(tenant=other_tenant, offset=0, limit=51) == []
