"""Policy, binding, quorum, edits, consumption, invalidation and expiry (emails:
test_notifications.py)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connections

from approvals.models import Approval, Policy
from runs.models import Run, Tenant, User
from tests.helpers import (
    BIG_REFUND,
    ApiClient,
    approval_of,
    decide,
    logged_in,
    make_user,
    propose,
    start_run,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch, gate
from toolcalls.models import ToolCall


def test_a_small_refund_needs_nobody(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent, {**BIG_REFUND, "amount_cents": 1500})
    assert call["execution_status"] == "authorized"
    assert call["approval"] is None


def test_a_refund_over_200_waits_for_one_approver(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    assert call["execution_status"] == "awaiting_approval"
    assert call["approval"]["state"] == "pending"
    assert call["approval"]["required_approvers"] == 1
    assert call["approval"]["rule"] == "refunds over $200"
    assert Run.objects.get(pk=call["run_id"]).state == "waiting"
    approval = approval_of(call)
    assert (approval.args_digest, approval.object_ref) == (call["args_digest"], "order:order-003")
    assert approval.policy_version == 1
    response = decide(logged_in(approver), approval, "approve")
    assert response.status_code == 302
    call = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}").json()
    assert call["execution_status"] == "authorized"
    assert call["approval"]["state"] == "approved"
    assert Run.objects.get(pk=call["run_id"]).state == "active"
    run_due()
    call = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}").json()
    assert (call["execution_status"], call["approval"]["state"]) == ("completed", "consumed")
    assert len(sandbox.ledger("payments")) == 1
    call_command("rebuild_projections", "--verify")


def test_two_distinct_approvers_over_1000_and_twice_counts_once(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    call = propose(agent, {**BIG_REFUND, "amount_cents": 120000})
    approval = approval_of(call)
    assert approval.required_approvers == 2
    alice = logged_in(approver)
    assert decide(alice, approval, "approve").status_code == 302
    approval.refresh_from_db()
    again = decide(alice, approval, "approve")
    assert again.status_code == 409
    assert "different people" in again.content.decode()
    approval.refresh_from_db()
    assert approval.state == "pending"
    assert decide(logged_in(bob), approval, "approve").status_code == 302
    approval.refresh_from_db()
    assert approval.state == "approved"


def test_the_requester_cannot_approve(agent: ApiClient, owner: User, sandbox: Sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    response = decide(logged_in(owner), approval, "approve")
    assert response.status_code == 403
    assert "someone else must decide" in response.content.decode()
    approval.refresh_from_db()
    assert approval.state == "pending"


def test_viewers_cannot_decide(agent: ApiClient, viewer: User, sandbox: Sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    assert decide(logged_in(viewer), approval, "approve").status_code == 403
    assert logged_in(viewer).get(f"/approvals/{approval.pk}/").status_code == 200


def test_another_tenants_approval_is_not_found(
    agent: ApiClient, other_tenant: Tenant, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    outsider = logged_in(make_user("mallory", other_tenant, User.Role.ADMIN))
    assert outsider.get(f"/approvals/{approval.pk}/").status_code == 404
    assert decide(outsider, approval, "approve").status_code == 404
    approval.refresh_from_db()
    assert approval.state == "pending"


def test_reject_needs_a_reason_and_rejects_the_call(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    alice = logged_in(approver)
    assert decide(alice, approval, "reject", reason="").status_code == 422
    assert decide(alice, approval, "reject", reason="customer already refunded").status_code == 302
    approval.refresh_from_db()
    assert approval.state == "rejected"
    assert ToolCall.objects.get(pk=call["tool_call_id"]).execution_status == "rejected"
    run_due()
    assert sandbox.ledger() == []


def test_a_stale_page_is_refused_saying_what_changed(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    seen = Approval.objects.get(pk=approval.pk)  # bob's page, rendered now
    decide(logged_in(approver), approval, "approve")
    response = decide(logged_in(bob), seen, "approve")
    assert response.status_code == 409
    page = response.content.decode()
    assert "already approved by alice" in page
    assert "Already decided: approved</strong> by alice" in page  # the banner as it is now


def test_a_changed_summary_hash_is_refused(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    approval.summary_hash = "0" * 64
    response = decide(logged_in(approver), approval, "approve")
    assert response.status_code == 409
    assert "changed since your page was rendered" in response.content.decode()


def test_approve_with_edits_lowers_the_amount(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    response = decide(
        logged_in(approver), approval, "edit", edit__amount_cents="15000", reason="half is fair"
    )
    assert response.status_code == 302
    tool_call = ToolCall.objects.get(pk=call["tool_call_id"])
    assert tool_call.args["amount_cents"] == 15000
    assert tool_call.args_digest != call["args_digest"]
    assert tool_call.execution_status == "authorized"  # $150 needs nobody
    approval.refresh_from_db()
    assert approval.state == "invalidated"
    assert approval.decisions.get().edit_diff == {"amount_cents": {"from": 25000, "to": 15000}}
    run_due()
    (effect,) = sandbox.ledger("payments")
    assert effect["payload"]["amount_cents"] == 15000
    call_command("rebuild_projections", "--verify")


def test_an_edit_that_raises_the_amount_needs_more_approvers(
    agent: ApiClient, approver: User, bob: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    decide(logged_in(approver), approval, "edit", edit__amount_cents="120000")
    replacement = approval_of(call)
    assert replacement.pk != approval.pk
    assert (replacement.required_approvers, replacement.state) == (2, "pending")
    assert replacement.decisions.count() == 1  # the editor's own
    decide(logged_in(bob), replacement, "approve")
    replacement.refresh_from_db()
    assert replacement.state == "approved"


def test_an_edit_is_validated_like_a_proposal(agent: ApiClient, approver: User, sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    response = decide(logged_in(approver), approval, "edit", edit__amount_cents="99999999")
    assert response.status_code == 422
    assert "amount_cents" in response.content.decode()
    approval.refresh_from_db()
    assert approval.state == "pending"


def test_a_change_of_the_object_invalidates_a_pending_approval(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    big = propose(
        agent,
        BIG_REFUND,
        run_id=run_id,
        intent="big",
        object={"ref": "order:order-003", "revision": 1},
    )
    # A write not computed from a revision (one writer per revision).
    small = propose(agent, {**BIG_REFUND, "amount_cents": 500}, run_id=run_id, intent="small")
    run_due()  # the small refund completes: order-003 is at revision 2 now
    assert ToolCall.objects.get(pk=small["tool_call_id"]).execution_status == "completed"
    assert approval_of(big).state == "invalidated"
    assert ToolCall.objects.get(pk=big["tool_call_id"]).execution_status == "invalidated"


def test_dispatch_refuses_an_expired_approval(agent: ApiClient, approver: User, sandbox) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    decide(logged_in(approver), approval, "approve")
    Approval.objects.filter(pk=approval.pk).update(expires_at="2000-01-01T00:00:00Z")
    dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
    tool_call = ToolCall.objects.get(pk=call["tool_call_id"])
    assert (tool_call.execution_status, tool_call.last_error_name) == ("failed", "approval.expired")
    assert sandbox.ledger() == []


def test_dispatch_refuses_arguments_the_approval_did_not_see(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    decide(logged_in(approver), approval, "approve")
    ToolCall.objects.filter(pk=call["tool_call_id"]).update(args_digest="tampered")
    dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
    approval.refresh_from_db()
    assert approval.state == "invalidated"
    tool_call = ToolCall.objects.get(pk=call["tool_call_id"])
    assert tool_call.execution_status == "awaiting_approval"  # people are asked again
    assert sandbox.ledger() == []


def test_dispatch_asks_again_when_the_policy_now_wants_more_approvers(
    agent: ApiClient, approver: User, bob: User, tenant: Tenant, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    decide(logged_in(approver), approval, "approve")  # one approver, as version 1 asked
    Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=2,
        rules=[{"name": "every refund by two", "when": "amount_cents > 0", "approvers": 2}],
    )
    dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
    approval.refresh_from_db()
    assert approval.state == "invalidated"
    invalidated = approval.run.events.get(
        approval_id=approval.pk, event_type="approval.invalidated"
    )
    assert invalidated.payload["reason"] == "the policy now asks for more approvers"
    replacement = approval_of(call)
    assert replacement.pk != approval.pk
    assert (replacement.state, replacement.required_approvers) == ("pending", 2)
    assert replacement.policy_version == 2
    tool_call = ToolCall.objects.get(pk=call["tool_call_id"])
    assert (tool_call.execution_status, tool_call.attempts.count()) == ("awaiting_approval", 0)
    assert Run.objects.get(pk=call["run_id"]).state == "waiting"
    assert sandbox.ledger() == []
    # Two people approve the new one: it is sent, once.
    decide(logged_in(approver), replacement, "approve")
    replacement.refresh_from_db()
    decide(logged_in(bob), replacement, "approve")
    run_due()
    assert approval_of(call).state == "consumed"
    assert len(sandbox.ledger("payments")) == 1


def test_stopping_the_run_cancels_its_pending_approval(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    stopped = agent.post(f"/api/v1/runs/{call['run_id']}/stop", {"reason": "customer withdrew"})
    assert stopped.status_code == 200
    approval.refresh_from_db()
    assert approval.state == "cancelled"
    alice = logged_in(approver)
    assert approval.pk not in alice.get("/approvals/").content.decode()  # not left in the inbox
    # An approver who still has the page open is told why nothing happens.
    response = decide(alice, approval, "approve")
    assert response.status_code == 409
    assert "already cancelled" in response.content.decode()
    approval.refresh_from_db()
    assert approval.state == "cancelled"
    assert ToolCall.objects.get(pk=call["tool_call_id"]).execution_status == "cancelled"
    run_due()
    assert sandbox.ledger() == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_dispatches_consume_an_approval_once(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    decide(logged_in(approver), approval, "approve")
    barrier = threading.Barrier(4)

    def dispatch_once() -> None:
        barrier.wait()
        dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
        connections.close_all()

    threads = [threading.Thread(target=dispatch_once) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tool_call = ToolCall.objects.get(pk=call["tool_call_id"])
    assert tool_call.attempts.count() == 1
    assert approval_of(call).state == "consumed"
    assert tool_call.run.events.filter(event_type="approval.consumed").count() == 1
    assert len(sandbox.ledger("payments")) == 1


def test_expiry_cancels_the_call_and_runs_once(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    Approval.objects.filter(pk=approval.pk).update(expires_at="2000-01-01T00:00:00Z")
    assert gate.approvals_expire_due() == 1
    assert gate.approvals_expire_due() == 0
    approval.refresh_from_db()
    assert approval.state == "expired"
    assert ToolCall.objects.get(pk=call["tool_call_id"]).execution_status == "expired"
    assert Run.objects.get(pk=call["run_id"]).state == "active"


def test_expiry_can_hand_the_run_to_a_person(agent: ApiClient, tenant: Tenant, sandbox) -> None:
    Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=1,
        rules=[{"name": "all", "when": "amount_cents > 0", "approvers": 1}],
        on_expiry="hand_to_human",
    )
    call = propose(agent, BIG_REFUND)
    Approval.objects.filter(tool_call_id=call["tool_call_id"]).update(
        expires_at="2000-01-01T00:00:00Z"
    )
    gate.approvals_expire_due()
    assert Run.objects.get(pk=call["run_id"]).state == "needs_human"


@pytest.mark.django_db(transaction=True)
def test_two_expiry_sweeps_at_once_change_nothing_twice(agent: ApiClient, sandbox) -> None:
    calls = [propose(agent, BIG_REFUND, intent=f"e{i}") for i in range(3)]
    Approval.objects.update(expires_at="2000-01-01T00:00:00Z")
    results: list[int] = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        barrier.wait()
        results.append(gate.approvals_expire_due())
        connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(results) == 3
    for call in calls:
        run = Run.objects.get(pk=call["run_id"])
        assert run.events.filter(event_type="approval.expired").count() == 1


def test_nothing_happens_on_get(agent: ApiClient, approver: User, sandbox: Sandbox) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    response = logged_in(approver).get(f"/approvals/{approval.pk}/approve/")
    assert response.status_code == 405
    approval.refresh_from_db()
    assert approval.state == "pending"


def test_the_inbox_lists_pending_approvals_most_urgent_first(
    agent: ApiClient, approver: User, bob: User, tenant: Tenant, sandbox: Sandbox
) -> None:
    later = approval_of(propose(agent, BIG_REFUND, intent="later"))
    sooner = approval_of(propose(agent, {**BIG_REFUND, "amount_cents": 120000}, intent="sooner"))
    Approval.objects.filter(pk=sooner.pk).update(expires_at=later.expires_at - timedelta(hours=1))
    decide(logged_in(bob), sooner, "approve")
    page = logged_in(approver).get("/approvals/").content.decode()
    assert page.index(sooner.pk) < page.index(later.pk)
    assert "1 of 2" in page and "0 of 1" in page
    partial = logged_in(approver).get("/approvals/", headers={"HX-Request": "true"})
    assert 'id="nav-approvals-count" hx-swap-oob="true">2<' in partial.content.decode()
