"""The inbox a page at a time, and its poll that answers 204 while nothing pending changed."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from approvals.models import Approval
from console.views import approvals as inbox_views
from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose
from tests.sandbox_process import Sandbox

HTMX = {"HX-Request": "true"}


@pytest.fixture
def five(agent: ApiClient, sandbox: Sandbox) -> list[Approval]:
    """Five pending approvals, the first to expire first."""
    approvals = [
        approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"i{n}"))
        for n in range(5)
    ]
    base = approvals[0].expires_at
    for n, approval in enumerate(approvals):
        Approval.objects.filter(pk=approval.pk).update(expires_at=base + timedelta(minutes=n))
    return approvals


def seen_token(response) -> str:
    """What the page tells its poll to send back (hx-vals)."""
    return re.search(r'"seen": "([^"]+)"', response.content.decode()).group(1)


def ids_on(response) -> list[str]:
    return [approval.id for approval in response.context["approvals"]]


def test_it_shows_one_page_at_a_time_soonest_first(
    five: list[Approval], approver: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inbox_views, "INBOX_PAGE_SIZE", 2)
    client = logged_in(approver)
    first = client.get("/approvals/")
    assert ids_on(first) == [five[0].pk, five[1].pk]
    assert 'href="?page=2"' in first.content.decode()
    assert "1 to 2 of 5" in first.content.decode()
    last = client.get("/approvals/", {"page": 3})
    assert ids_on(last) == [five[4].pk]
    assert "?page=4" not in last.content.decode()
    assert 'href="?page=2"' in last.content.decode()


def test_a_page_it_cannot_read_is_the_first(five: list[Approval], approver: User) -> None:
    for page in ("x", "-1", "0", "99999999"):
        response = logged_in(approver).get("/approvals/", {"page": page})
        assert ids_on(response)[0] == five[0].pk


def test_the_poll_sends_nothing_while_nothing_changed(
    five: list[Approval], approver: User, bob: User
) -> None:
    client = logged_in(approver)
    seen = seen_token(client.get("/approvals/", headers=HTMX))
    assert client.get("/approvals/", {"seen": seen}, headers=HTMX).status_code == 204
    decide(logged_in(bob), five[0], "approve")
    changed = client.get("/approvals/", {"seen": seen}, headers=HTMX)
    assert changed.status_code == 200
    assert five[0].pk not in changed.content.decode()
    assert 'id="nav-approvals-count" hx-swap-oob="true">4<' in changed.content.decode()


def test_a_new_approval_wakes_the_poll(
    five: list[Approval], agent: ApiClient, approver: User
) -> None:
    client = logged_in(approver)
    seen = seen_token(client.get("/approvals/", headers=HTMX))
    propose(agent, {**BIG_REFUND, "amount_cents": 20_200}, intent="new")
    assert client.get("/approvals/", {"seen": seen}, headers=HTMX).status_code == 200
