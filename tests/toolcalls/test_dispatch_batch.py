"""Batched dispatch (toolcalls/dispatch_batch.py) against the sandbox over HTTP: each call of a
batch ends as the single-call path ends it, with the same rows and the same events."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from runs import services as run_services
from runs.models import Event, OutboxMessage, Run
from tests.helpers import REFUND, consistency_window, fresh, propose_in
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_until
from toolcalls import dispatch, dispatch_batch, reconcile, sweeps
from toolcalls.models import ToolCall
from toolcalls.writes import DISPATCH_TASK, tool_call_lock


def assert_log_matches_state() -> None:
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def refunds(run: Run, count: int, first: int = 0) -> list[ToolCall]:
    return [
        propose_in(run, {**REFUND, "amount_cents": 100 + i}, intent=f"batch-{i}")
        for i in range(first, first + count)
    ]


def message_of(call: ToolCall) -> OutboxMessage:
    return OutboxMessage.objects.filter(task=DISPATCH_TASK, args__0=call.pk).earliest(
        "available_at"
    )


def items_of(calls: list[ToolCall]) -> list[tuple[str, str | None]]:
    return [(call.pk, message_of(call).pk) for call in calls]


def story(call: ToolCall) -> list[tuple[str, str, str, list[str], int | None]]:
    """What the call's events say, without ids and times: type, producer, actor, fields, and
    which of the call's events caused each (its place in the list)."""
    events = list(Event.objects.filter(tool_call_id=call.pk).order_by("seq"))
    place = {e.id: index for index, e in enumerate(events)}
    return [
        (e.event_type, e.producer, e.actor, sorted(e.payload), place.get(e.causation_id))
        for e in events
    ]


def rows(call: ToolCall) -> dict[str, Any]:
    """The call's rows as the dispatch left them, without ids and times."""
    call = fresh(call)
    return {
        "call": (
            call.execution_status,
            call.verification_status,
            call.fencing_token,
            call.verifications,
            call.lease_expires_at,
            call.last_error_name,
        ),
        "attempts": list(
            call.attempts.values_list(
                "number", "fencing_token", "classification", "error_name", "http_status"
            )
        ),
        "receipts": list(call.receipts.values_list("status", "source")),
        "outbox": sorted(
            (m.task, m.done_at is not None) for m in OutboxMessage.objects.filter(args__0=call.pk)
        ),
    }


@pytest.mark.django_db
def test_a_batch_confirms_each_call_once_with_the_single_paths_rows_and_events(
    run: Run, sandbox: Sandbox
) -> None:
    other, _ = run_services.run_start(tenant=run.tenant, title="other", actor="test")
    single = propose_in(other, {**REFUND, "amount_cents": 99}, intent="single")
    dispatch.tool_call_dispatch(tool_call_id=single.pk, outbox_id=message_of(single).pk)
    calls = refunds(run, 4) + refunds(other, 2, first=4)

    dispatch_batch.tool_calls_dispatch_batch(items_of(calls))

    for call in calls:
        assert len(sandbox.effects_for(call.external_request_id)) == 1
        assert rows(call) == rows(single)
        assert story(call) == story(single)
    types = [event_type for event_type, *_ in story(single)]
    assert types[types.index("tool_call.dispatching") :][-1] == "tool_call.confirmed_success"
    assert_log_matches_state()


@pytest.mark.django_db
def test_a_batch_of_one_writes_what_the_single_path_writes(run: Run, sandbox: Sandbox) -> None:
    single, batched = refunds(run, 2)

    dispatch.tool_call_dispatch(tool_call_id=single.pk, outbox_id=message_of(single).pk)
    dispatch_batch.tool_calls_dispatch_batch(items_of([batched]))

    assert rows(batched) == rows(single)
    assert story(batched) == story(single)
    assert_log_matches_state()


@pytest.mark.django_db
def test_a_stale_token_is_refused_for_that_call_only(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    current, stale = refunds(run, 2)
    claims = dispatch_batch.claim_batch(items_of([current, stale]), worker="paused-worker")
    # The batch's worker pauses; the lease of one of its calls runs out, the sweeper hands it
    # to reconciliation, which proves it absent, and another worker claims it again: it is
    # `dispatching` still, under a newer token.
    ToolCall.objects.filter(pk=stale.pk).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert sweeps.leases_sweep_expired() == 1
    consistency_window(monkeypatch, stale.capability_id, 0)
    reconcile.tool_call_reconcile(tool_call_id=stale.pk)
    again = dispatch_batch.claim_batch([(stale.pk, None)], worker="second-worker")
    assert fresh(stale).execution_status == "dispatching"

    outcomes = dispatch_batch.send_batch(claims)  # the paused worker wakes up and sends both
    accepted = dispatch_batch.record_batch(list(zip(claims, outcomes, strict=True)))
    dispatch_batch.verify_batch(accepted)

    assert [call.pk for call, _ in accepted] == [current.pk]
    assert fresh(current).verification_status == "confirmed_success"
    assert fresh(current).attempts.get().classification == "confirmed"
    refused = Event.objects.filter(event_type="tool_call.stale_result_refused")
    assert list(refused.values_list("tool_call_id", flat=True)) == [stale.pk]
    assert fresh(stale).receipts.count() == 0  # the late answer was not taken
    # The second worker's own answer is (same key: the gateway deduplicated the resend).
    late = dispatch_batch.send_batch(again)
    dispatch_batch.verify_batch(dispatch_batch.record_batch(list(zip(again, late, strict=True))))
    stale = fresh(stale)
    assert stale.verification_status == "confirmed_success" and stale.fencing_token == 2
    classifications = stale.attempts.order_by("number").values_list("classification", flat=True)
    assert list(classifications) == ["stale", "confirmed"]
    assert stale.receipts.count() == 1
    for call in (current, stale):
        assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


@pytest.mark.django_db
def test_a_lost_answer_makes_that_call_unknown_and_the_others_confirm(
    run: Run, sandbox: Sandbox
) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    calls = refunds(run, 3)

    dispatch_batch.tool_calls_dispatch_batch(items_of(calls))

    statuses = sorted(fresh(call).execution_status for call in calls)
    assert statuses == ["completed", "completed", "result_unknown"]
    lost = next(c for c in calls if fresh(c).execution_status == "result_unknown")
    assert fresh(lost).last_error_name == "tool.connection_lost"
    assert all(
        fresh(c).verification_status == "confirmed_success" for c in calls if c.pk != lost.pk
    )
    # Reconciliation finds the lost one done, by look-up: one effect each, none twice.
    run_until(lambda: fresh(lost).verification_status == "confirmed_success")
    for call in calls:
        assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


@pytest.mark.django_db
def test_a_call_already_dispatched_or_missing_is_done_and_left_alone(
    run: Run, sandbox: Sandbox
) -> None:
    done, fresh_one = refunds(run, 2)
    dispatch.tool_call_dispatch(tool_call_id=done.pk)
    now = timezone.now()
    duplicate = OutboxMessage.objects.create(task=DISPATCH_TASK, args=[done.pk], available_at=now)
    missing = OutboxMessage.objects.create(
        task=DISPATCH_TASK, args=["tc_missing"], available_at=now
    )

    dispatch_batch.tool_calls_dispatch_batch(
        [(done.pk, duplicate.pk), ("tc_missing", missing.pk), *items_of([fresh_one])]
    )

    assert fresh(done).attempts.count() == 1
    assert fresh(fresh_one).verification_status == "confirmed_success"
    assert (
        OutboxMessage.objects.filter(pk__in=[duplicate.pk, missing.pk], done_at=None).count() == 0
    )


@pytest.mark.django_db(transaction=True)
def test_a_call_locked_by_another_transaction_is_skipped_and_comes_again(
    run: Run, sandbox: Sandbox
) -> None:
    free, held = refunds(run, 2)
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        """Another worker, between its lock of `held` and its commit."""
        try:
            with transaction.atomic():
                tool_call_lock(held.pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10)
        dispatch_batch.tool_calls_dispatch_batch(items_of([free, held]))
        assert not release.is_set()  # the batch did not wait for the held call
    finally:
        release.set()
        thread.join()

    assert fresh(free).verification_status == "confirmed_success"
    assert fresh(held).execution_status == "authorized"
    assert message_of(held).done_at is None  # it comes again
    assert message_of(free).done_at is not None

    dispatch_batch.tool_calls_dispatch_batch(items_of([held]))
    assert fresh(held).verification_status == "confirmed_success"
    assert message_of(held).done_at is not None
    assert len(sandbox.effects_for(fresh(held).external_request_id)) == 1


def fail_for(monkeypatch: pytest.MonkeyPatch, name: str, bad: ToolCall) -> None:
    """`name` (claim_locked or record_locked) raises for `bad`, on both paths."""
    original = getattr(dispatch, name)

    def broken(call: ToolCall, *args: Any, **kwargs: Any) -> Any:
        if call.pk == bad.pk:
            raise RuntimeError(f"a bug in {name} of one call")
        return original(call, *args, **kwargs)

    monkeypatch.setattr(dispatch, name, broken)
    monkeypatch.setattr(dispatch_batch, name, broken)


@pytest.mark.django_db
def test_a_claim_that_raises_fails_its_call_alone(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = refunds(run, 2)
    fail_for(monkeypatch, "claim_locked", bad)

    dispatch_batch.tool_calls_dispatch_batch(items_of([good, bad]))

    assert fresh(good).verification_status == "confirmed_success"
    assert fresh(bad).execution_status == "authorized"
    assert message_of(bad).done_at is None  # it comes again
    assert sandbox.effects_for(bad.external_request_id) == []


@pytest.mark.django_db
def test_a_record_that_raises_loses_only_its_own_answer(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = refunds(run, 2)
    fail_for(monkeypatch, "record_locked", bad)

    dispatch_batch.tool_calls_dispatch_batch(items_of([good, bad]))

    assert fresh(good).verification_status == "confirmed_success"
    # Sent, not recorded: its lease runs out and reconciliation looks it up.
    assert fresh(bad).execution_status == "dispatching"
    assert fresh(bad).attempts.get().classification == "in_flight"
    assert len(sandbox.effects_for(bad.external_request_id)) == 1
