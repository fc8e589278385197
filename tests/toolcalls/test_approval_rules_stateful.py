"""The approval and dispatch rules as a property (hypothesis `RuleBasedStateMachine`), on the
real PostgreSQL database and the sandbox over HTTP.

Hypothesis drives random sequences of what agents and people do — propose refunds (amounts
around the policy's thresholds, new or reused intents), approve, reject or approve with edits
as a random person (the requester, a viewer and an admin among them), let approvals expire,
dispatch, stop the run — and after every step checks the rules that must always hold:

- no approval is consumed twice, nor for arguments it did not see (its digest is the call's);
- a call the policy holds back is never sent without a consumed approval for its arguments;
- a quorum is made of distinct people, never the requester, never a viewer;
- at most one effect per idempotency key in the sandbox's ledger, with the arguments approved;
- the projections replayed from the event log equal the stored rows.

Each example starts from the same state: its writes are rolled back to a savepoint in
`teardown` (the test's `db` transaction spans all examples), and the sandbox is re-seeded.
Deterministic in CI (`derandomize`); PROPERTY_EXAMPLES raises the number of examples and
PROPERTY_RANDOM=1 explores new ones, for a longer local run.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from approvals.models import Approval, ApprovalDecision
from runs import projections
from runs import services as run_services
from runs.canonical import digest
from runs.errors import DomainError
from runs.models import Event, Tenant, User
from toolcalls import capabilities, dispatch, gate, lifecycle
from toolcalls.models import Execution, ToolCall
from toolcalls.propose import tool_call_propose

REFUND = "refund-order-v2"
# Orders of the seeded sandbox with enough captured to refund past both thresholds (order-003:
# $1,500) or one (order-002: $350).
ORDERS = ["order-002", "order-003"]
# Around the default policy: over 20000 one approver, over 100000 two.
AMOUNTS = [1500, 20_000, 20_001, 35_000, 100_000, 100_001, 120_000]
INTENTS = ["intent-a", "intent-b", "intent-c", "intent-d", "intent-e"]
# "requester" is the person the agent acts for; victor is a viewer, olivia an admin.
PEOPLE = ["requester", "alice", "bob", "olivia", "victor"]


@dataclass
class World:
    tenant: Tenant
    requester: User
    people: dict[str, User]
    sandbox: Any


WORLD: list[World] = []


class ApprovalAndDispatchRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = WORLD[0]
        # Everything this example writes is undone in teardown (see the module's docstring).
        self.savepoint = transaction.savepoint()
        self.world.sandbox.reset()
        self.run_id = self._start_run()
        self.calls: list[str] = []

    def teardown(self) -> None:
        transaction.savepoint_rollback(self.savepoint)

    def _start_run(self) -> str:
        run, _ = run_services.run_start(tenant=self.world.tenant, title="refunds", actor="agent")
        return run.pk

    # --- what agents and people do --------------------------------------------------------

    @rule(
        order=st.sampled_from(ORDERS),
        amount=st.sampled_from(AMOUNTS),
        intent=st.sampled_from(INTENTS),
    )
    def propose(self, order: str, amount: int, intent: str) -> None:
        args = {"order_id": order, "amount_cents": amount, "currency": "USD"}
        try:
            call, _ = tool_call_propose(
                tenant=self.world.tenant,
                run_id=self.run_id,
                capability_id=REFUND,
                args=args,
                intent=intent,
                actor="agent",
                requested_by=self.world.requester,
            )
        except DomainError:
            return  # refused (not refundable, key conflict, run closed): nothing written
        if call.pk not in self.calls:
            self.calls.append(call.pk)

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), person=st.sampled_from(PEOPLE))
    def approve(self, data: st.DataObject, person: str) -> None:
        self._decide(gate.tool_call_approve, self._approval(data), person)

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), person=st.sampled_from(["alice", "bob", "olivia"]))
    def approve_as_an_approver(self, data: st.DataObject, person: str) -> None:
        """The same as `approve`, by people who may: so that more sequences reach dispatch."""
        self.approve(data, person)

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), person=st.sampled_from(PEOPLE))
    def reject(self, data: st.DataObject, person: str) -> None:
        self._decide(gate.tool_call_reject, self._approval(data), person, reason="not this one")

    @precondition(lambda self: self.calls)
    @rule(data=st.data(), person=st.sampled_from(PEOPLE), amount=st.sampled_from(AMOUNTS))
    def approve_with_edits(self, data: st.DataObject, person: str, amount: int) -> None:
        edits = {"amount_cents": amount}
        approval = self._approval(data)
        self._decide(gate.tool_call_approve_with_edits, approval, person, edits=edits)

    @precondition(lambda self: self.calls)
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """The deadline passes: the approval's expiry is moved into the past, then the beat's
        sweep expires it."""
        approval = self._approval(data)
        if approval is None:
            return
        Approval.objects.filter(pk=approval.pk).update(
            expires_at=timezone.now() - timedelta(days=1)
        )
        gate.approvals_expire_due()

    @precondition(lambda self: self.calls)
    @rule(data=st.data())
    def dispatch(self, data: st.DataObject) -> None:
        """The dispatch task, in process, against the sandbox. Mostly for an authorized call;
        for any other it is a late or duplicate message, which must change nothing."""
        authorized = list(
            ToolCall.objects.filter(
                pk__in=self.calls, execution_status=Execution.AUTHORIZED
            ).values_list("pk", flat=True)
        )
        call_id = data.draw(st.sampled_from(authorized or self.calls))
        dispatch.tool_call_dispatch(tool_call_id=call_id)

    @rule(roll=st.integers(0, 3))
    def stop_run(self, roll: int) -> None:
        """Stop the run (one time in four: it cancels everything open) and start another."""
        if roll:
            return
        lifecycle.run_stop(tenant=self.world.tenant, run_id=self.run_id, actor="agent")
        self.run_id = self._start_run()

    def _approval(self, data: st.DataObject) -> Approval | None:
        """Mostly a pending approval; sometimes any approval of the run, decided or not."""
        approvals = Approval.objects.filter(tool_call_id__in=self.calls).order_by("created_at")
        pending = [a for a in approvals if a.is_pending]
        candidates = pending if pending and data.draw(st.integers(0, 3)) else list(approvals)
        return data.draw(st.sampled_from(candidates)) if candidates else None

    def _decide(self, command: Any, approval: Approval | None, person: str, **fields: Any) -> None:
        if approval is None:
            return
        user = self.world.requester if person == "requester" else self.world.people[person]
        # Refused (the requester, a viewer, twice, already decided): nothing written, which
        # the invariants check.
        with contextlib.suppress(DomainError):
            command(
                tenant=self.world.tenant,
                approval_id=approval.pk,
                user=user,
                seen_version=approval.version,
                seen_summary_hash=approval.summary_hash,
                **fields,
            )

    # --- what must always hold ------------------------------------------------------------

    @invariant()
    def approvals_are_consumed_once_for_what_they_showed(self) -> None:
        consumed = Event.objects.filter(
            tenant=self.world.tenant, event_type="approval.consumed"
        ).values_list("approval_id", flat=True)
        assert len(consumed) == len(set(consumed)), f"an approval consumed twice: {consumed}"
        for approval in Approval.objects.filter(
            tenant=self.world.tenant, state=Approval.State.CONSUMED
        ).select_related("tool_call"):
            assert approval.args_digest == digest(approval.args), approval.pk
            assert approval.args_digest == approval.tool_call.args_digest, (
                f"{approval.pk} consumed for arguments it did not see"
            )

    @invariant()
    def quorum_is_distinct_people_never_the_requester(self) -> None:
        for approval in Approval.objects.filter(tenant=self.world.tenant):
            decisions = list(approval.decisions.select_related("user"))
            for decision in decisions:
                assert decision.user_id != approval.requested_by_id, (
                    f"{decision.user.username} decided their own request {approval.pk}"
                )
                assert decision.user.can_decide, f"viewer {decision.user.username} decided"
            approvers = {d.user_id for d in decisions if d.decision != ApprovalDecision.Kind.REJECT}
            if approval.state in (Approval.State.APPROVED, Approval.State.CONSUMED):
                assert len(approvers) >= approval.required_approvers, (
                    f"{approval.pk} approved by {len(approvers)} of "
                    f"{approval.required_approvers} distinct people"
                )

    @invariant()
    def no_call_held_back_is_sent_without_its_approval(self) -> None:
        capability = capabilities.get(REFUND)
        sent = ToolCall.objects.filter(tenant=self.world.tenant, attempts__isnull=False)
        for call in sent.distinct():
            needed = gate.requirement_for(call, capability)
            if needed.approvers == 0:
                continue
            assert call.approvals.filter(
                state=Approval.State.CONSUMED,
                args_digest=call.args_digest,
                required_approvers__gte=needed.approvers,
            ).exists(), f"{call.pk} was sent without an approval for its arguments"

    @invariant()
    def one_effect_per_key_with_the_approved_arguments(self) -> None:
        effects = self.world.sandbox.ledger("payments")
        keys = [effect["idempotency_key"] for effect in effects]
        assert len(keys) == len(set(keys)), f"duplicate effects: {keys}"
        calls = {
            call.idempotency_key: call for call in ToolCall.objects.filter(tenant=self.world.tenant)
        }
        for effect in effects:
            call = calls[effect["idempotency_key"]]
            assert effect["payload"]["amount_cents"] == call.args["amount_cents"], effect

    @invariant()
    def the_log_replays_to_the_stored_rows(self) -> None:
        assert projections.verify() == []


EXAMPLES = int(os.environ.get("PROPERTY_EXAMPLES", "40"))


@pytest.mark.django_db
def test_approval_and_dispatch_rules_hold(
    tenant: Tenant,
    owner: User,
    approver: User,
    bob: User,
    admin_user: User,
    viewer: User,
    sandbox: Any,
) -> None:
    people = {"alice": approver, "bob": bob, "olivia": admin_user, "victor": viewer}
    WORLD[:] = [World(tenant=tenant, requester=owner, people=people, sandbox=sandbox)]
    try:
        run_state_machine_as_test(
            ApprovalAndDispatchRules,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=20,
                deadline=None,
                derandomize=os.environ.get("PROPERTY_RANDOM") != "1",
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        WORLD.clear()
