"""Summaries as a person reads them: the stored summary ("Refund 1200.00 USD …") stays as
the contract wrote it (it is hashed into events), and pages show its amount as money."""

from __future__ import annotations

import re

from approvals.models import Approval
from console import formatting
from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, logged_in, propose


def test_the_helper_writes_the_amount_as_money_and_keeps_the_rest() -> None:
    args = {"order_id": "order-7", "amount_cents": 120000, "currency": "eur"}
    stored = "Refund 1200.00 EUR on order order-7."
    assert formatting.summary_text("refund-order-v2", args, stored) == (
        "Refund €1,200.00 on order order-7."
    )


def test_without_a_known_capability_or_amount_it_keeps_the_stored_summary() -> None:
    stored = "Refund 1200.00 USD on order order-7."
    assert formatting.summary_text("no-such-capability", {}, stored) == stored
    assert formatting.summary_text("refund-order-v2", {"currency": "USD"}, stored) == stored
    assert formatting.summary_text("refund-order-v2", "not a dict", stored) == stored


def test_the_inbox_row_shows_money(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}))
    assert "1200.00 USD" in approval.summary
    page = logged_in(approver).get("/approvals/").content.decode()
    assert "Refund $1,200.00 on order" in page
    assert "1200.00 USD" not in page


def test_the_approval_page_title_and_heading_show_money(
    agent: ApiClient, approver: User, sandbox
) -> None:
    approval = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}))
    page = logged_in(approver).get(f"/approvals/{approval.pk}/").content.decode()
    assert "<title>Refund $1,200.00 on order" in page
    assert "<h1>Refund $1,200.00 on order" in page
    assert "1200.00 USD" not in page
    # What is stored (and hashed into events) is unchanged.
    assert "1200.00 USD" in Approval.objects.get(pk=approval.pk).summary


def test_the_run_page_shows_money(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}))
    page = logged_in(approver).get(f"/runs/{approval.run_id}/").content.decode()
    assert "Refund $1,200.00 on order" in page
    assert "A person decides Refund $1,200.00" in page
    # Only the raw event payloads (folded <pre> blocks) keep the stored words.
    outside_payloads = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    assert "1200.00 USD" not in outside_payloads
