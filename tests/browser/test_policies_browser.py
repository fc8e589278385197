"""A tenant admin edits a policy in a real browser: tries the changed rule against a recent
call before saving (nothing saved), sees a bad condition refused with the issue's words,
publishes, and a real worker dispatches the next call under the new version while the call
proposed before keeps waiting under the old one."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from approvals.models import Policy
from runs.models import User
from tests.browser.conftest import log_in
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, approval_of, propose, wait_for
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REFUND = "refund-order-v2"


def test_an_admin_tries_a_rule_then_publishes_it(
    page: Page, live_server, agent: ApiClient, admin_user: User, sandbox: Sandbox, start_celery
) -> None:
    waiting = propose(agent, BIG_REFUND, intent="before")  # $250.00: one approver under v1
    assert waiting["status"] == "awaiting_approval"
    start_celery("worker")
    log_in(page, live_server.url, "olivia", PASSWORD)
    page.goto(f"{live_server.url}/policies/")
    expect(page.locator("#policies")).to_contain_text(
        "Refunds with amount over 200.00 (in the call's currency) need 1 approver"
    )
    page.get_by_role("link", name="Refund an order").click()
    page.get_by_role("link", name="Edit the policy").click()

    # Raise the first rule's threshold to $300 and try it on the waiting $250 call.
    page.get_by_label("Rule 1: Value").fill("300")
    page.get_by_label("A recent call").select_option(waiting["tool_call_id"])
    page.get_by_role("button", name="Try this rule").click()
    expect(page.locator("#try-draft")).to_contain_text("Goes through without approval")
    expect(page.locator("#try-now")).to_contain_text(
        "Needs 1 approver, by rule “refunds over $200”"
    )
    assert list(Policy.objects.values_list("version", flat=True)) == [1]  # nothing saved

    # A condition outside the language is refused in the words, in the try box.
    page.get_by_label("Rule 3: Name").fill("double")
    page.get_by_label("Rule 3: Or a condition").fill("amount * 2")
    page.get_by_role("button", name="Try this rule").click()
    expect(page.locator("#try-result")).to_contain_text(
        "a condition can compare a field with a value; `amount * 2` is not allowed"
    )
    page.get_by_label("Rule 3: Name").fill("")
    page.get_by_label("Rule 3: Or a condition").fill("")
    page.get_by_role("button", name="Try this rule").click()
    expect(page.locator("#try-draft")).to_contain_text("Goes through without approval")

    page.get_by_role("button", name="Publish version 2").click()
    expect(page.get_by_text("Published version 2.")).to_be_visible()
    expect(page.locator("#diff .diff-added").first).to_contain_text(
        "over 300.00 (in the call's currency)"
    )
    expect(page.locator("#diff .diff-removed").first).to_contain_text(
        "over 200.00 (in the call's currency)"
    )

    # The next $250 refund is judged by version 2: no approval, and the worker sends it.
    sent = propose(agent, BIG_REFUND, intent="after")
    assert sent["status"] != "awaiting_approval"
    wait_for(
        lambda: ToolCall.objects.get(pk=sent["tool_call_id"]).execution_status == "completed",
        timeout=30,
        what="the worker to send the refund proposed under version 2",
    )
    still = approval_of(waiting)
    assert (still.state, still.policy_version) == ("pending", 1)


def test_enter_in_a_rule_publishes_the_policy_and_adds_no_row(
    page: Page, live_server, admin_user: User
) -> None:
    """Enter in a text field submits the form's default action, as a person expects: the
    policy is published with what was typed; it does not add an empty rule."""
    log_in(page, live_server.url, "olivia", PASSWORD)
    page.goto(f"{live_server.url}/policies/{REFUND}/edit/")
    rows = page.locator("#rules tr.rule").count()
    page.get_by_label("Rule 1: Value").fill("300")
    page.get_by_label("Rule 1: Value").press("Enter")
    expect(page.get_by_text("Published version 2.")).to_be_visible()
    assert page.url == f"{live_server.url}/policies/{REFUND}/"
    published = Policy.objects.get(capability_id=REFUND, version=2)
    assert len(published.rules) == rows - 1  # the empty last row is no rule
    assert "30000" in str(published.rules[0])

    # Enter in the expiry's hours publishes too, from a fresh editor: still no row added.
    page.goto(f"{live_server.url}/policies/{REFUND}/edit/")
    assert page.locator("#rules tr.rule").count() == rows
    page.get_by_label("Approvals expire after: hours").fill("3")
    page.get_by_label("Approvals expire after: hours").press("Enter")
    expect(page.get_by_text("Published version 3.")).to_be_visible()
    assert Policy.objects.get(capability_id=REFUND, version=3).expiry_seconds == 3 * 3600
