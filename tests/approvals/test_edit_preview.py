"""Edits are safe to make (issue #11, point 2): typed inputs, a preview of the change as a
diff with warnings, a confirm step that sends exactly what was previewed (and is refused once
the approval changed), errors next to their fields after a redirect, and the second approver
seeing who changed what."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from django.test import Client

from approvals.models import Approval
from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall


def preview(client: Client, approval: Approval, **typed: str) -> str:
    """Post the typed form; returns where it redirected to."""
    fields = {f"arg__{name}": value for name, value in typed.items()}
    response = client.post(f"/approvals/{approval.pk}/edit/preview/", fields)
    assert response.status_code == 302
    return response["Location"]


def confirm(client: Client, approval: Approval, location: str, reason: str = "") -> object:
    token = parse_qs(urlparse(location).query)["t"][0]
    return client.post(
        f"/approvals/{approval.pk}/edit/",
        {
            "preview": token,
            "version": approval.version,
            "summary_hash": approval.summary_hash,
            "reason": reason,
        },
    )


def test_a_preview_shows_the_diff_and_what_it_changes_and_writes_nothing(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="1,200", reason="duplicate charge")
    assert location.startswith(f"/approvals/{approval.pk}/edit/confirm/?t=")
    page = alice.get(location).content.decode()
    assert "Amount $250.00 → $1,200.00" in page
    warnings = page[page.index('id="edit-warnings"') :]
    assert "The edit raises the amount from $250.00 to $1,200.00." in warnings
    assert "rule “refunds over $1,000” asks for 2 (now 1)" in warnings
    assert "Confirm and approve" in page
    approval.refresh_from_db()
    assert (approval.state, approval.decisions.count()) == ("pending", 0)
    assert ToolCall.objects.get(pk=call["tool_call_id"]).args == BIG_REFUND


def test_confirming_saves_the_previewed_edit_and_the_second_approver_sees_it_at_the_top(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="1200.00")
    response = confirm(alice, approval, location, reason="the customer was charged twice")
    assert response.status_code == 302
    replacement = approval_of(call)
    assert replacement.pk != approval.pk and replacement.required_approvers == 2
    assert ToolCall.objects.get(pk=call["tool_call_id"]).args["amount_cents"] == 120000
    flash = alice.get(response["Location"]).content.decode()
    assert "Approved with your edits — 1 of 2, waiting for a second approver." in flash
    page = logged_in(bob).get(f"/approvals/{replacement.pk}/").content.decode()
    top = page[page.index('id="decided"') : page.index('id="approval-banner"')]
    assert "<strong>alice</strong>" in top
    assert 'changed <span class="diff">Amount <del>$250.00</del> → <ins>$1,200.00</ins>' in top
    assert "“the customer was charged twice”" in top


def test_a_preview_made_stale_by_another_decision_is_refused(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    # Over $1,000: two approvers. Alice previews an edit; meanwhile bob approves as it stands.
    call = propose(agent, {**BIG_REFUND, "amount_cents": 110000})
    approval = approval_of(call)
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="1000")
    decide(logged_in(bob), approval, "approve")
    assert 'id="preview-stale"' in alice.get(location).content.decode()
    response = confirm(alice, approval, location)
    assert response.status_code == 409
    assert "approval.stale" in response.content.decode()
    assert ToolCall.objects.get(pk=call["tool_call_id"]).args["amount_cents"] == 110000


def test_an_altered_preview_is_refused(agent: ApiClient, approver: User, sandbox: Sandbox) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="100")
    response = confirm(alice, approval, location.replace("?t=", "?t=x"))
    assert response.status_code == 409
    assert "approval.preview_stale" in response.content.decode()
    assert ToolCall.objects.get(pk=call["tool_call_id"]).args["amount_cents"] == 25000


def test_errors_are_shown_next_to_their_field_after_a_redirect(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="12.345", reason="x")
    assert location == f"/approvals/{approval.pk}/#edit"
    page = alice.get(location).content.decode()
    assert '<details id="edit" open>' in page
    assert 'value="12.345"' in page and 'aria-invalid="true"' in page
    assert (
        '<small class="field-problem" id="problem__amount_cents">Type at most 2 decimals.' in page
    )
    # Shown once: a refresh shows the page as it is.
    assert "field-problem" not in alice.get(location).content.decode()


def test_an_amount_the_order_cannot_cover_is_refused_at_the_preview(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="1600")  # 1500 captured
    page = alice.get(location).content.decode()
    problem = page[page.index('id="problem__amount_cents"') :]
    assert "At most 150000 cents of this order can still be refunded" in problem


def test_a_preview_that_changes_nothing_says_so(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    alice = logged_in(approver)
    location = preview(alice, approval, amount_cents="250")
    page = alice.get(location).content.decode()
    assert "Nothing changed: change a value, or approve it as it stands." in page


def test_the_form_is_typed_from_the_schema(
    agent: ApiClient, approver: User, sandbox: Sandbox, monkeypatch
) -> None:
    """Money in dollars, enums as a select, required fields marked, the object read-only."""
    import dataclasses

    from toolcalls import capabilities

    refund = capabilities.get("refund-order-v2")
    schema = {**refund.input_schema, "properties": dict(refund.input_schema["properties"])}
    schema["properties"]["currency"] = {"type": "string", "title": "Currency", "enum": ["USD"]}
    monkeypatch.setitem(
        capabilities.REGISTRY, refund.id, dataclasses.replace(refund, input_schema=schema)
    )
    approval = approval_of(propose(agent, BIG_REFUND))
    page = logged_in(approver).get(f"/approvals/{approval.pk}/").content.decode()
    form = page[page.index('<details id="edit"') : page.index("Preview changes")]
    assert '<label for="arg__amount_cents">Amount (USD) <span class="required"' in form
    assert '<select id="arg__currency" name="arg__currency" required><option selected>USD' in form
    assert '<label for="arg__reason">Reason</label>' in form  # optional: no marker
    assert 'id="arg__order_id" value="order-003" readonly disabled' in form
