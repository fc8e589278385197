"""The approval page is enough to decide (issue #11, point 1): the object read from the
external system through the capability, a warning about the same call asked twice, labelled
and formatted arguments, why a person is asked, and who decided what."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import User
from tests.helpers import (
    BIG_REFUND,
    ApiClient,
    approval_of,
    decide,
    logged_in,
    propose,
    start_run,
)
from tests.sandbox_process import Sandbox


def context_panel(user: User, approval) -> str:
    return logged_in(user).get(f"/approvals/{approval.pk}/context/").content.decode()


def test_a_refund_is_shown_against_the_order_as_the_payment_system_has_it(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    # order-003: 150000 cents captured. $100 went out at the gateway itself, and another
    # refund of $300 waits here for its approval.
    sandbox.post("payments", "/refunds", {**BIG_REFUND, "amount_cents": 10000}, request_id="r-1")
    run_id = start_run(agent)
    other = propose(agent, {**BIG_REFUND, "amount_cents": 30000}, run_id=run_id, intent="a")
    call = propose(agent, BIG_REFUND, run_id=run_id, intent="b")
    panel = context_panel(approver, approval_of(call))
    assert "Read from the payment gateway" in panel
    facts = panel[panel.index('id="context-facts"') :]
    assert "customer-003@example.com" in facts
    assert "<dt>Captured</dt><dd>$1,500.00</dd>" in facts
    assert "<dt>Refunded so far</dt><dd>$100.00</dd>" in facts
    assert 'Pending or in flight here (1 refund)</dt><dd class="warn">$300.00' in facts
    # 1500 - 100 - 300: what this refund of $250 is weighed against.
    assert "<dt>Refundable now</dt><dd>$1,100.00</dd>" in facts
    assert other["tool_call_id"]


class Silent:
    """A TCP server that accepts connections and never answers: a gateway that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for held in self.held:
            held.close()


@pytest.fixture
def silent_gateway() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def test_a_gateway_that_hangs_gives_a_sentence_not_a_hung_page(
    agent: ApiClient, approver: User, sandbox: Sandbox, settings, silent_gateway: Silent
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    settings.SANDBOX_URL = silent_gateway.url
    page = logged_in(approver).get(f"/approvals/{approval.pk}/").content.decode()
    assert "Refund $250.00 on order order-003" in page  # the page itself reads nothing there
    panel = context_panel(approver, approval)
    assert "couldn&#x27;t reach the payment gateway (timed out after 2 s)" in panel
    assert '<time datetime="' in panel[panel.index("context-problem") :]


def test_a_gateway_that_is_down_is_said_so(
    agent: ApiClient, approver: User, sandbox: Sandbox, settings
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        settings.SANDBOX_URL = f"http://127.0.0.1:{unused.getsockname()[1]}"
    panel = context_panel(approver, approval)
    assert "couldn&#x27;t reach the payment gateway (the connection was refused)" in panel


def test_a_waybill_shows_the_address_and_the_reservation(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    from toolcalls.models import ToolCall

    call = propose(
        agent,
        {"order_id": "order-010", "address_id": "addr-001", "reservation_id": "rsv_seed0001"},
        capability="create-waybill-v1",
    )
    stored = ToolCall.objects.get(pk=call["tool_call_id"])
    from toolcalls import context

    read = context.object_context(tenant=approver.tenant, call=stored)
    facts = {fact.label: fact for fact in read.facts}
    assert read.problem is None
    assert "addr-001" not in facts["Address"].value  # the address itself, not its id
    assert facts["Reservation"].value.startswith("1 x PART-200 in wh-acme-1 for order-010")
    assert not facts["Reservation"].warn


def test_a_capability_without_a_reader_lists_the_other_calls_on_the_object(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    big = {"warehouse_id": "wh-acme-2", "sku": "PART-100", "quantity": 25, "order_id": "order-004"}
    run_id = start_run(agent)
    first = propose(agent, big, capability="reserve-stock-v1", run_id=run_id, intent="a")
    second = propose(
        agent, {**big, "quantity": 21}, capability="reserve-stock-v1", run_id=run_id, intent="b"
    )
    panel = context_panel(approver, approval_of(second))
    listed = panel[panel.index('id="context-nearby"') :]
    assert first["tool_call_id"] in listed
    assert "Reserve 25 x PART-100 in wh-acme-2 for order-004." in listed
    assert second["tool_call_id"] not in listed


def test_the_same_refund_asked_twice_is_warned_of(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    first = propose(agent, BIG_REFUND, intent="first")
    second = approval_of(propose(agent, BIG_REFUND, intent="second"))
    page = logged_in(approver).get(f"/approvals/{second.pk}/").content.decode()
    warning = page[page.index('id="duplicate-warning"') :]
    assert "The same refund was asked for before." in warning
    assert first["tool_call_id"] in warning
    assert "$250.00" in warning
    assert "identical arguments" in warning


def test_a_refund_alone_on_its_order_gets_no_warning(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    page = logged_in(approver).get(f"/approvals/{approval.pk}/").content.decode()
    assert 'id="duplicate-warning"' not in page


def test_arguments_are_labelled_and_money_is_money(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}))
    page = logged_in(approver).get(f"/approvals/{approval.pk}/").content.decode()
    arguments = page[page.index('id="arguments"') : page.index("Why a person decides")]
    assert '<th scope="row" data-label="Argument">Amount</th><td>$1,200.00</td>' in arguments
    assert "amount_cents" not in arguments
    why = page[page.index('id="why-asked"') :]
    assert "Rule <strong>“refunds over $1,000”</strong>: Amount over $1,000.00" in why
    assert "policy v1, 2 approvers needed" in why
    assert 'data-relative title="' in page and ">just now</time>" in page


def test_the_agents_decision_is_shown_as_json(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    decision = agent.post(
        f"/api/v1/runs/{run_id}/decisions",
        {"kind": "refund-eligibility", "content": {"eligible": True, "why": "damaged"}},
    ).json()
    call = propose(agent, BIG_REFUND, run_id=run_id, decision_id=decision["decision_id"])
    page = logged_in(approver).get(f"/approvals/{approval_of(call).pk}/").content.decode()
    shown = page[page.index('id="decision-json"') :]
    assert "{\n  &quot;eligible&quot;: true,\n  &quot;why&quot;: &quot;damaged&quot;\n}" in shown


def test_who_decided_is_at_the_top(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}))
    decide(logged_in(approver), approval, "approve", reason="checked the order")
    page = logged_in(bob).get(f"/approvals/{approval.pk}/").content.decode()
    decided = page[page.index('id="decided"') : page.index('id="approval-banner"')]
    assert "<strong>alice</strong>" in decided
    assert "approved" in decided
    assert "“checked the order”" in decided


def _page_queries(client, approval) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(f"/approvals/{approval.pk}/").status_code == 200
    return len(queries)


def test_the_page_makes_as_many_queries_with_many_calls_on_the_object_as_with_few(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    # 1200 USD: two approvers; bob approves first so the page lists a decision.
    approval = approval_of(
        propose(agent, {**BIG_REFUND, "amount_cents": 120000}, run_id=run_id, intent="main")
    )
    decide(logged_in(bob), approval, "approve")
    approval.refresh_from_db()
    alice = logged_in(approver)
    _page_queries(alice, approval)  # warm: the session, the policy
    few = _page_queries(alice, approval)
    for n in range(8):
        propose(agent, {**BIG_REFUND, "amount_cents": 500 + n}, run_id=run_id, intent=f"o{n}")
    many = _page_queries(alice, approval)
    page = alice.get(f"/approvals/{approval.pk}/").content.decode()
    assert page.count("identical") == 0 and page.count("$5.0") == 16  # warning and table
    assert many == few
