"""What the approval page tells a person after they decide."""

from __future__ import annotations

from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose


def test_the_flash_says_what_the_decision_led_to(
    agent: ApiClient, approver: User, bob: User, sandbox
) -> None:
    # Over $1,000 the default policy asks two distinct approvers.
    approval = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}))
    alice = logged_in(approver)
    decide(alice, approval, "approve")
    page = alice.get(f"/approvals/{approval.pk}/").content.decode()
    assert "Approved — 1 of 2, waiting for a second approver." in page
    approval.refresh_from_db()
    second = logged_in(bob)
    decide(second, approval, "approve")
    page = second.get(f"/approvals/{approval.pk}/").content.decode()
    assert "Approved — the call is on its way." in page


def test_a_rejection_says_the_call_will_not_run(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    alice = logged_in(approver)
    decide(alice, approval, "reject", reason="customer called back")
    page = alice.get(f"/approvals/{approval.pk}/").content.decode()
    assert "Rejected — the call will not run, and the agent is told why." in page


def test_after_deciding_the_page_links_to_the_next_approval(
    agent: ApiClient, approver: User, sandbox
) -> None:
    first = approval_of(propose(agent, BIG_REFUND, intent="first"))
    second = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 24000}, intent="second"))
    alice = logged_in(approver)
    before = alice.get(f"/approvals/{first.pk}/").content.decode()
    assert "Next approval →" not in before  # she has this one to decide first
    decide(alice, first, "approve")
    after = alice.get(f"/approvals/{first.pk}/").content.decode()
    assert f'href="/approvals/{second.pk}/" id="next-approval"' in after
