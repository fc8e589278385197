"""Approve with edits: what an approver may change, and how strictly the values are read
(issue #10, point 4)."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import Approval
from runs.errors import DomainError
from runs.models import User
from tests.helpers import ApiClient, approval_of, decide, logged_in, propose, tool_call_of
from tests.sandbox_process import Sandbox
from toolcalls import gate

# Over $200 (one approver) on order-012, which the approver moved to order-013.
REFUND_012 = {"order_id": "order-012", "amount_cents": 25000, "currency": "USD"}


def unchanged(call: dict[str, Any], approval: Approval) -> None:
    """Nothing of the refused edit was written: the call, its approval and its events."""
    stored = tool_call_of(call)
    assert (stored.args, stored.args_digest) == (REFUND_012, call["args_digest"])
    assert stored.object_ref == "order:order-012"
    assert stored.execution_status == "awaiting_approval"
    approval.refresh_from_db()
    assert (approval.state, approval.decisions.count()) == ("pending", 0)
    assert not stored.run.events.filter(event_type="tool_call.args_edited").exists()


def test_an_edit_of_the_order_is_refused_and_nothing_is_written(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, REFUND_012)
    approval = approval_of(call)
    response = decide(
        logged_in(approver), approval, "edit", edit__order_id="order-013", reason="wrong order"
    )
    assert response.status_code == 422
    page = response.content.decode()
    assert "approval.edit_not_allowed" in page
    assert "order_id says which object this call acts on (order:order-012)" in page
    unchanged(call, approval)
    assert sandbox.ledger() == []


def test_the_page_shows_the_fields_that_identify_the_object_read_only(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, REFUND_012))
    page = logged_in(approver).get(f"/approvals/{approval.pk}/").content.decode()
    # The typed form (issue #11): the amount in dollars, previewed before it is saved.
    assert 'name="arg__amount_cents" value="250.00" type="text" inputmode="decimal"' in page
    assert 'name="arg__order_id"' not in page  # not submitted with the form
    assert 'id="arg__order_id" value="order-012" readonly disabled' in page
    assert "identifies order:order-012: not editable" in page


@pytest.mark.parametrize(
    "typed",
    [
        "\u0661\u0665\u0660\u0660\u0660",  # Arabic-Indic digits: int() reads 15000
        "15_000",  # int() reads 15000
        " 15000",  # int() strips the space
        "+15000",
        "15000.0",
        "1e4",
        "",
        "9" * 5000,  # more digits than int() converts
    ],
)
def test_an_integer_is_ascii_digits_with_an_optional_minus_and_nothing_else(
    typed: str, agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, REFUND_012)
    approval = approval_of(call)
    response = decide(logged_in(approver), approval, "edit", edit__amount_cents=typed)
    assert response.status_code == 422
    page = response.content.decode()
    assert "tool.validation_failed" in page
    assert "args.amount_cents" in page
    unchanged(call, approval)


def test_an_edited_integer_in_plain_digits_is_taken(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, REFUND_012)
    response = decide(logged_in(approver), approval_of(call), "edit", edit__amount_cents="015000")
    assert response.status_code == 302
    assert tool_call_of(call).args["amount_cents"] == 15000


@pytest.mark.parametrize(
    ("edits", "name", "field"),
    [
        ({"order_id": "order-013"}, "approval.edit_not_allowed", "args.order_id"),
        ({"amount_cents": 15000.0}, "tool.validation_failed", "args.amount_cents"),
        ({"amount_cents": "15000"}, "tool.validation_failed", "args.amount_cents"),
        ({"amount_cents": 2**60}, "tool.validation_failed", "args.amount_cents"),
        ({"reason": "a\x00b"}, "tool.validation_failed", "args.reason"),
    ],
)
def test_the_service_checks_edits_whatever_the_page_sent(
    edits: dict[str, Any],
    name: str,
    field: str,
    agent: ApiClient,
    approver: User,
    sandbox: Sandbox,
) -> None:
    call = propose(agent, REFUND_012)
    approval = approval_of(call)
    with pytest.raises(DomainError) as refused:
        gate.tool_call_approve_with_edits(
            tenant=approver.tenant,
            approval_id=approval.pk,
            user=approver,
            seen_version=approval.version,
            seen_summary_hash=approval.summary_hash,
            edits=edits,
        )
    assert refused.value.name == name
    assert [detail["field"] for detail in refused.value.details] == [field]
    unchanged(call, approval)
