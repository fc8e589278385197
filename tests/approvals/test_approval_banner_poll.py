"""The approval page's banner is polled every 2 s by each open page: the poll reads what the
banner shows, not the page's other panels (issue #11)."""

from __future__ import annotations

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose

HTMX = {"HX-Request": "true"}


def queries(client: Client, path: str, headers: dict[str, str]) -> tuple[int, str]:
    client.get(path, headers=headers)  # the session and the user are read once, not counted
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, headers=headers)
    assert response.status_code == 200
    return len(captured), response.content.decode()


def test_the_banner_poll_reads_only_the_banner(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    alice = logged_in(approver)
    path = f"/approvals/{approval.pk}/"
    page, content = queries(alice, path, {})
    poll, banner = queries(alice, path, HTMX)
    assert 'id="approval-banner"' in banner
    assert "Waiting for approval" in banner
    assert 'id="feedback"' in content and 'id="feedback"' not in banner
    # Not the history, the other calls, the feedback, nor the inbox's next approval.
    assert poll <= page - 3, (poll, page)


def test_the_banner_poll_says_when_it_is_decided(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    alice = logged_in(approver)
    decide(alice, approval, "approve")
    banner = alice.get(f"/approvals/{approval.pk}/", headers=HTMX).content.decode()
    assert "Already decided: approved" in banner
    # Out of band: the decision forms go, nothing can be decided any more.
    assert 'id="decision-forms" hx-swap-oob="true"' in banner
