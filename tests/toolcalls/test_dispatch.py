"""Dispatch, outcomes, reconciliation and verification against the sandbox over HTTP.

Services run in the test's thread (tests/toolcalls/inline_worker.py) so each fault lands
between known steps; tests/toolcalls/test_faults_workers.py does the same with real Celery
worker processes.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from runs import services as run_services
from runs.errors import DomainError
from runs.models import OutboxMessage, Run, Tenant, User
from tests.helpers import REFUND, WAYBILL, fresh, logged_in, open_the_circuit, propose_in
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due, run_until
from toolcalls import capabilities, commands, dispatch, dispatch_batch, lifecycle, sweeps
from toolcalls.models import Attempt, CircuitBreaker, ObjectRevision, Receipt, ToolCall


def assert_log_matches_state() -> None:
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def test_a_refund_is_accepted_completed_and_verified(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    run_due()
    call = fresh(call)
    assert (call.execution_status, call.verification_status) == ("completed", "confirmed_success")
    assert call.external_id.startswith("re_")
    receipt = call.receipts.get()
    assert (receipt.status, receipt.source) == ("created", "dispatch")
    effects = sandbox.effects_for(call.external_request_id)
    assert len(effects) == 1
    assert effects[0]["idempotency_key"] == call.idempotency_key
    assert_log_matches_state()


def test_a_duplicate_message_does_nothing_twice(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)  # the same message delivered again
    assert fresh(call).attempts.count() == 1
    assert len(sandbox.effects_for(call.external_request_id)) == 1


def test_a_definite_rejection_fails_the_call(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(
        run, {"order_id": "order-002", "address_id": "addr-bad-001"}, capability="create-waybill-v1"
    )
    run_due()
    call = fresh(call)
    assert call.execution_status == "failed"
    assert call.last_error_name == "tool.rejected"
    assert "address_invalid" in call.last_error_message
    assert sandbox.ledger("carrier") == []


def test_a_lost_response_is_unknown_then_found_by_look_up(run: Run, sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    call = fresh(call)
    assert call.execution_status == "result_unknown"
    assert call.last_error_name == "tool.connection_lost"
    run_until(lambda: fresh(call).verification_status == "confirmed_success")
    call = fresh(call)
    assert call.execution_status == "completed"
    assert call.receipts.get().source == Receipt.Source.LOOKUP
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


def test_a_request_that_never_arrived_is_sent_again_with_the_same_key(
    run: Run, sandbox: Sandbox
) -> None:
    sandbox.faults(system="payments", drop_request_before_commit=1.0, times=1)
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    assert fresh(call).execution_status == "result_unknown"
    run_until(lambda: fresh(call).execution_status == "completed")
    attempts = list(fresh(call).attempts.order_by("number"))
    assert [a.classification for a in attempts] == ["unknown", "confirmed"]
    effects = sandbox.effects_for(call.external_request_id)
    assert len(effects) == 1
    assert effects[0]["idempotency_key"] == call.idempotency_key
    assert_log_matches_state()


def test_a_timeout_after_commit_is_unknown_and_never_doubled(run: Run, sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=3, times=1)
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    assert fresh(call).last_error_name == "tool.timeout"
    run_until(lambda: fresh(call).execution_status == "completed")
    assert len(sandbox.effects_for(call.external_request_id)) == 1


def test_the_carrier_without_idempotency_gets_one_waybill_despite_look_up_lag(
    run: Run, sandbox: Sandbox
) -> None:
    # The carrier ignores keys and its look-up lags: only look-up-before-retry prevents twins.
    sandbox.faults(system="carrier", drop_response_after_commit=1.0, times=1, lookup_lag_seconds=2)
    call = propose_in(run, WAYBILL, capability="create-waybill-v1")
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    assert fresh(call).execution_status == "result_unknown"
    run_until(lambda: fresh(call).execution_status == "completed", timeout=30)
    assert len(sandbox.ledger("carrier")) == 1
    assert fresh(call).lookups >= 1
    assert_log_matches_state()


def test_rate_limits_are_retried_with_backoff_then_succeed(run: Run, sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", http_429=1.0, retry_after=1, times=2)
    call = propose_in(run)
    run_until(lambda: fresh(call).execution_status == "completed")
    attempts = list(fresh(call).attempts.order_by("number"))
    assert [a.error_name for a in attempts] == ["tool.rate_limited", "tool.rate_limited", ""]
    assert len(sandbox.effects_for(call.external_request_id)) == 1


def test_retries_give_up_after_the_policy_and_can_be_retried_by_hand(
    run: Run, sandbox: Sandbox, monkeypatch
) -> None:
    sandbox.faults(system="payments", http_5xx=1.0)
    monkeypatch.setattr(dispatch, "backoff", lambda policy, failures, retry_after: 0.0)
    call = propose_in(run)
    run_until(lambda: fresh(call).execution_status == "failed")
    call = fresh(call)
    assert call.last_error_name == "tool.upstream_5xx"
    assert call.attempts.count() == 5
    sandbox.clear_faults()
    CircuitBreaker.objects.all().delete()
    commands.tool_call_retry(tenant=run.tenant, tool_call_id=call.pk, actor="test")
    run_until(lambda: fresh(call).execution_status == "completed")
    assert len(sandbox.effects_for(call.external_request_id)) == 1


def test_a_5xx_storm_opens_the_circuit_and_a_probe_closes_it(
    run: Run, sandbox: Sandbox, settings, monkeypatch
) -> None:
    calls = open_the_circuit(run, sandbox, settings, monkeypatch)
    breaker = CircuitBreaker.objects.get(capability_id="refund-order-v2")
    assert breaker.state == "open"
    sent_before = Attempt.objects.count()
    for call in calls:
        dispatch.tool_call_dispatch(tool_call_id=call.pk)
    assert Attempt.objects.count() == sent_before  # open: nothing is sent
    assert all(fresh(c).execution_status == "authorized" for c in calls)
    sandbox.clear_faults()
    run_until(lambda: all(fresh(c).execution_status == "completed" for c in calls), timeout=30)
    assert CircuitBreaker.objects.get(pk=breaker.pk).state == "closed"


def _circuit_due_to_half_open(
    run: Run, sandbox: Sandbox, settings, monkeypatch
) -> tuple[list[ToolCall], CircuitBreaker]:
    """open_the_circuit, then its open time over and its four calls due now: the next claim
    takes the probe. The sandbox's 5xx faults are still on."""
    calls = open_the_circuit(run, sandbox, settings, monkeypatch)
    ToolCall.objects.filter(pk__in=[c.pk for c in calls]).update(next_attempt_at=None)
    breaker = CircuitBreaker.objects.get(capability_id="refund-order-v2")
    CircuitBreaker.objects.filter(pk=breaker.pk).update(opened_until=timezone.now())
    return calls, breaker


def test_a_probe_whose_worker_died_hands_the_probe_on(
    run: Run, sandbox: Sandbox, settings, monkeypatch
) -> None:
    """The probe's worker dies after sending: the reconciler finds the refund, and the
    dispatcher never records the answer that would close the breaker. The next call takes the
    probe over instead of waiting for good (manage.py soak found six refunds deferred every
    2 s for 300 s behind such a probe)."""
    calls, breaker = _circuit_due_to_half_open(run, sandbox, settings, monkeypatch)
    sandbox.clear_faults()
    probe = dispatch.tool_call_claim(tool_call_id=calls[0].pk, outbox_id=None, worker="dies")
    assert probe is not None
    assert CircuitBreaker.objects.get(pk=breaker.pk).state == "half_open"
    dispatch.send(probe)  # sent; the worker dies before recording the answer
    # While the probe is dispatching, the others wait for its answer.
    sent_before = Attempt.objects.count()
    dispatch.tool_call_dispatch(tool_call_id=calls[1].pk)
    assert fresh(calls[1]).execution_status == "authorized"
    assert Attempt.objects.count() == sent_before
    ToolCall.objects.filter(pk=probe.tool_call_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert sweeps.leases_sweep_expired() == 1
    # The reconciler finds the refund; the others' deferred dispatches come due meanwhile and
    # one of them takes the probe over once the first is no longer dispatching.
    run_until(lambda: all(fresh(c).execution_status == "completed" for c in calls), timeout=20)
    assert CircuitBreaker.objects.get(pk=breaker.pk).state == "closed"
    assert all(len(sandbox.effects_for(c.external_request_id)) == 1 for c in calls)
    assert_log_matches_state()


def test_an_old_probes_late_failure_leaves_the_new_probe_alone(
    run: Run, sandbox: Sandbox, settings, monkeypatch
) -> None:
    """The first probe's worker pauses with a 5xx in hand; its lease runs out, the next call
    takes the probe over and is sent. The paused worker then records its 5xx: a stale result,
    refused before the breaker hears of it (and a half-open breaker ignores the failure of a
    call that is no longer its probe: the test fails only with both guards gone), so the
    breaker neither reopens nor loses its new probe, whose success closes it."""
    calls, breaker = _circuit_due_to_half_open(run, sandbox, settings, monkeypatch)
    old = dispatch.tool_call_claim(tool_call_id=calls[0].pk, outbox_id=None, worker="paused")
    assert old is not None
    late = dispatch.send(old)
    assert late.error_name == "tool.upstream_5xx"  # in hand, not recorded: the worker pauses
    ToolCall.objects.filter(pk=old.tool_call_id).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert sweeps.leases_sweep_expired() == 1
    sandbox.clear_faults()
    new = dispatch.tool_call_claim(tool_call_id=calls[1].pk, outbox_id=None, worker="next")
    assert new is not None
    breaker = CircuitBreaker.objects.get(pk=breaker.pk)
    assert (breaker.state, breaker.probe_tool_call_id) == ("half_open", new.tool_call_id)
    answer = dispatch.send(new)
    assert dispatch.record_outcome(old, late) is None
    assert Attempt.objects.get(pk=old.attempt_id).classification == "stale"
    breaker = CircuitBreaker.objects.get(pk=breaker.pk)
    assert (breaker.state, breaker.probe_tool_call_id) == ("half_open", new.tool_call_id)
    dispatch.record_outcome(new, answer)
    assert CircuitBreaker.objects.get(pk=breaker.pk).state == "closed"
    assert fresh(calls[1]).execution_status == "completed"


def test_a_batch_sends_one_probe_when_the_circuit_half_opens(
    run: Run, sandbox: Sandbox, settings, monkeypatch
) -> None:
    """A batch claims its calls in one transaction and saves them at its end: the second
    call must not take the probe the first took a moment before (the database still says
    the first is authorized)."""
    calls, breaker = _circuit_due_to_half_open(run, sandbox, settings, monkeypatch)
    sandbox.clear_faults()
    claims = dispatch_batch.claim_batch([(c.pk, None) for c in calls])
    assert len(claims) == 1
    breaker = CircuitBreaker.objects.get(pk=breaker.pk)
    assert (breaker.state, breaker.probe_tool_call_id) == ("half_open", claims[0].tool_call_id)
    waiting = [c for c in calls if c.pk != claims[0].tool_call_id]
    assert all(fresh(c).execution_status == "authorized" for c in waiting)


def test_a_stale_workers_result_is_refused(run: Run, sandbox: Sandbox, settings) -> None:
    call = propose_in(run)
    stale = dispatch.tool_call_claim(tool_call_id=call.pk, outbox_id=None, worker="paused-worker")
    # Its lease runs out while it is paused; the sweeper hands the call to reconciliation,
    # which proves it absent and dispatches it again with a new fencing token.
    ToolCall.objects.filter(pk=call.pk).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert sweeps.leases_sweep_expired() == 1
    run_until(lambda: fresh(call).execution_status == "completed", timeout=20)
    late = dispatch.send(stale)  # the paused worker wakes up and sends with the same key
    dispatch.record_outcome(stale, late)
    call = fresh(call)
    assert call.fencing_token == 2
    assert call.attempts.get(number=1).classification == "stale"
    assert call.receipts.count() == 1
    assert call.run.events.filter(event_type="tool_call.stale_result_refused").count() == 1
    # Same key: the payment gateway deduplicated the late resend.
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


def test_one_writer_per_object_revision(run: Run, sandbox: Sandbox) -> None:
    first = propose_in(run, REFUND, intent="a", object_revision=1)
    with pytest.raises(DomainError, match=first.pk) as refused:
        propose_in(run, {**REFUND, "amount_cents": 100}, intent="b", object_revision=1)
    assert refused.value.name == "precondition.conflict"
    dispatch.tool_call_dispatch(tool_call_id=first.pk)  # completes: order-002 moves to revision 2
    with pytest.raises(DomainError, match="at revision 2"):
        propose_in(run, {**REFUND, "amount_cents": 100}, intent="c", object_revision=1)
    assert propose_in(run, {**REFUND, "amount_cents": 100}, intent="d", object_revision=2)


def test_a_precondition_change_stops_the_call(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run, REFUND, intent="a", object_revision=1)
    # The order changes before the call is sent (another system's write).
    ObjectRevision.objects.filter(ref="order:order-002").update(revision=2)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    call = fresh(call)
    assert call.execution_status == "failed"
    assert call.last_error_name == "precondition.conflict"
    assert sandbox.ledger() == []


def test_a_call_waits_for_its_dependencies(run: Run, sandbox: Sandbox) -> None:
    warranty = propose_in(
        run, {"order_id": "order-002"}, capability="check-warranty-v1", intent="warranty"
    )
    reserve = propose_in(
        run,
        {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1, "order_id": "order-002"},
        capability="reserve-stock-v1",
        intent="reserve",
        depends_on=[warranty.pk],
    )
    dispatch.tool_call_dispatch(tool_call_id=reserve.pk)
    assert fresh(reserve).attempts.count() == 0  # the warranty is not confirmed yet
    run_due()
    assert fresh(warranty).verification_status == "confirmed_success"
    assert fresh(reserve).verification_status == "confirmed_success"
    assert [e["operation"] for e in sandbox.ledger()] == ["reservation.create"]


def test_a_failed_dependency_cancels_the_call(run: Run, sandbox: Sandbox) -> None:
    waybill = propose_in(
        run,
        {"order_id": "order-002", "address_id": "addr-bad-001"},
        capability="create-waybill-v1",
        intent="ship",
    )
    email = propose_in(
        run,
        {
            "order_id": "order-002",
            "to": "customer-002@example.com",
            "subject": "Shipped",
            "body": "On its way.",
        },
        capability="send-email-v1",
        intent="notify",
        depends_on=[waybill.pk],
    )
    # Its message arrives too early: it waits, and the message is used up.
    message = OutboxMessage.objects.get(task="toolcalls.dispatch", args=[email.pk])
    dispatch.tool_call_dispatch(tool_call_id=email.pk, outbox_id=message.pk)
    run_due()
    assert fresh(waybill).execution_status == "failed"
    assert fresh(email).execution_status == "authorized"
    assert sweeps.dependents_sweep_waiting() == 1
    run_due()
    assert fresh(email).execution_status == "cancelled"
    assert sandbox.ledger() == []


def test_dependencies_must_be_calls_of_the_same_run(run: Run, tenant, sandbox) -> None:
    other, _ = run_services.run_start(tenant=tenant, title="other", actor="t")
    foreign = propose_in(other, {"order_id": "order-002"}, capability="get-order-v1", intent="read")
    with pytest.raises(DomainError) as refused:
        propose_in(
            run,
            {"order_id": "order-001"},
            capability="get-order-v1",
            intent="x",
            depends_on=[foreign.pk],
        )
    assert refused.value.details[0]["field"] == "depends_on"


def test_the_runs_attempt_budget_stops_dispatch(tenant: Tenant, sandbox: Sandbox) -> None:
    run, _ = run_services.run_start(tenant=tenant, title="t", actor="t", max_attempts=1)
    sandbox.faults(system="payments", http_429=1.0, retry_after=0, times=1)
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)  # attempt 1: 429, rescheduled
    ToolCall.objects.filter(pk=call.pk).update(next_attempt_at=None)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    call = fresh(call)
    assert call.execution_status == "failed"
    assert call.last_error_name == "flow.budget_exceeded"
    assert sandbox.ledger() == []


def test_a_run_past_its_deadline_sends_nothing(tenant: Tenant, sandbox: Sandbox) -> None:
    run, _ = run_services.run_start(
        tenant=tenant, title="t", actor="t", deadline=timezone.now() + timedelta(hours=1)
    )
    call = propose_in(run)
    Run.objects.filter(pk=run.pk).update(deadline="2000-01-01T00:00:00Z")  # it passes
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    call = fresh(call)
    assert (call.execution_status, call.last_error_name) == ("failed", "flow.deadline_exceeded")
    assert call.attempts.count() == 0
    assert sandbox.ledger() == []


def test_a_call_whose_capability_is_no_longer_registered_is_not_sent(
    run: Run, viewer: User, sandbox: Sandbox, monkeypatch
) -> None:
    call = propose_in(run)
    monkeypatch.delitem(capabilities.REGISTRY, "refund-order-v2")  # its contract left the code
    message = OutboxMessage.objects.get(task="toolcalls.dispatch", args=[call.pk])
    dispatch.tool_call_dispatch(tool_call_id=call.pk, outbox_id=message.pk)
    call = fresh(call)
    assert (call.execution_status, call.last_error_name) == ("failed", "capability.unknown")
    assert call.attempts.count() == 0
    message.refresh_from_db()
    assert message.done_at is not None  # done: not republished forever
    assert sandbox.ledger() == []
    assert logged_in(viewer).get(f"/runs/{run.pk}/").status_code == 200  # still readable


def test_compensation_runs_once_and_only_for_a_confirmed_call(run: Run, sandbox: Sandbox):
    reserve = propose_in(
        run,
        {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 2, "order_id": "order-002"},
        capability="reserve-stock-v1",
    )
    with pytest.raises(DomainError, match=r"compensation\.not_confirmed"):
        commands.tool_call_compensate(tenant=run.tenant, tool_call_id=reserve.pk, actor="t")
    run_due()
    first, created = commands.tool_call_compensate(
        tenant=run.tenant, tool_call_id=reserve.pk, actor="t"
    )
    again, created_again = commands.tool_call_compensate(
        tenant=run.tenant, tool_call_id=reserve.pk, actor="t"
    )
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert first.idempotency_key.endswith(f":compensate:{reserve.pk}")
    run_due()
    assert fresh(reserve).execution_status == "compensated"
    assert fresh(first).verification_status == "confirmed_success"
    operations = [e["operation"] for e in sandbox.ledger("warehouse")]
    assert operations == ["reservation.create", "reservation.release"]
    assert_log_matches_state()


def test_a_cancelled_runs_late_result_does_not_revive_it(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    claim = dispatch.tool_call_claim(tool_call_id=call.pk, outbox_id=None, worker="w")
    _, in_flight = lifecycle.run_stop(tenant=run.tenant, run_id=run.pk, actor="t")
    assert [c.pk for c in in_flight] == [call.pk]
    dispatch.record_outcome(claim, dispatch.send(claim))
    assert fresh(call).execution_status == "completed"  # the fact is kept
    assert Run.objects.get(pk=run.pk).state == "cancelled"  # the run stays cancelled
