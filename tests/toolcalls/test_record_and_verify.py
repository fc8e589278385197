"""A batch records its answers and writes their verifications in one transaction
(toolcalls/dispatch_batch.py): observed before the record, judged in the record's
transaction, each call saved once. An observation that raises or comes late does not hold the
record back: the call is recorded accepted and its verification's message runs later."""

from __future__ import annotations

import cProfile
import pstats
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from runs import services as run_services
from runs import transitions
from runs.models import OutboxMessage, Run
from tests.helpers import REFUND, fresh, propose_in
from tests.sandbox_process import Sandbox
from tests.toolcalls.test_dispatch_batch import (
    assert_log_matches_state,
    items_of,
    message_of,
    refunds,
    rows,
    story,
)
from tests.toolcalls.test_record_writes import statements
from toolcalls import dispatch, dispatch_batch, verify
from toolcalls.models import ObjectRevision, ToolCall
from toolcalls.writes import DISPATCH_TASK, VERIFY_TASK, tool_call_transition

pytestmark = pytest.mark.django_db


def verification_message(call: ToolCall) -> OutboxMessage:
    return OutboxMessage.objects.get(task=VERIFY_TASK, args__0=call.pk)


def judging(monkeypatch: pytest.MonkeyPatch, judgment: Any) -> None:
    """Every observation, on both paths, answers `judgment(external_id)`."""
    original = verify.observe_answer

    def observed(capability: Any, slug: str, external_id: str, *args: Any, **kw: Any) -> str:
        answer = judgment(external_id)
        return answer or original(capability, slug, external_id, *args, **kw)

    monkeypatch.setattr(verify, "observe_answer", observed)
    monkeypatch.setattr(dispatch, "observe_answer", observed)


def test_a_batch_records_and_verifies_in_one_transaction(run: Run, sandbox: Sandbox) -> None:
    other, _ = run_services.run_start(tenant=run.tenant, title="other", actor="test")
    calls = refunds(run, 2) + refunds(other, 2, first=2)

    with CaptureQueriesContext(connection) as queries:
        dispatch_batch.tool_calls_dispatch_batch(items_of(calls))

    locks = [q for q in queries.captured_queries if "FOR NO KEY UPDATE OF c" in q["sql"]]
    assert len(locks) == 2  # the claim's and the record's: the verification locks nothing more
    counted = statements(queries)
    assert counted["UPDATE toolcalls_toolcall"] == 2  # the four claims, then record + verify
    assert counted["UPDATE runs_outboxmessage"] == 1  # the dispatch messages; none for verify
    assert counted["INSERT runs_event"] == 2
    for call in calls:
        assert fresh(call).verification_status == "confirmed_success"
        assert verification_message(call).done_at is not None  # written done
        assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


def test_an_inconclusive_verification_is_written_as_the_single_path_writes_it(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    judging(monkeypatch, lambda external_id: "inconclusive")
    single, *batched = refunds(run, 3)

    dispatch.tool_call_dispatch(tool_call_id=single.pk, outbox_id=message_of(single).pk)
    with CaptureQueriesContext(connection) as queries:
        dispatch_batch.tool_calls_dispatch_batch(items_of(batched))

    # The claims, then the records with their verifications' counts: not one more per call.
    assert statements(queries)["UPDATE toolcalls_toolcall"] == 2
    for call in batched:
        assert rows(call) == rows(single)
        assert story(call) == story(single)
        assert (fresh(call).verification_status, fresh(call).verifications) == ("pending", 1)
    assert_log_matches_state()


def test_a_read_and_a_write_in_one_batch_end_as_on_the_single_path(
    run: Run, sandbox: Sandbox
) -> None:
    read = {"order_id": "order-002"}
    single_read = propose_in(run, read, capability="get-order-v1", intent="r-single")
    single_write = propose_in(run, {**REFUND, "amount_cents": 98}, intent="w-single")
    for call in (single_read, single_write):
        dispatch.tool_call_dispatch(tool_call_id=call.pk, outbox_id=message_of(call).pk)
    batched_read = propose_in(run, read, capability="get-order-v1", intent="r-batch")
    (batched_write,) = refunds(run, 1)

    dispatch_batch.tool_calls_dispatch_batch(items_of([batched_read, batched_write]))

    for mine, theirs in ((batched_read, single_read), (batched_write, single_write)):
        assert rows(mine) == rows(theirs)
        assert story(mine) == story(theirs)
    assert fresh(batched_read).verification_status == "confirmed_success"
    assert_log_matches_state()


def test_an_observation_that_raises_leaves_the_call_accepted_for_its_message(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing, fine = refunds(run, 2)

    original = dispatch.observe_answer
    failing_ids: set[str] = set()

    def raising(capability: Any, slug: str, external_id: str, args: Any, **kw: Any) -> str:
        if args["amount_cents"] == failing.args["amount_cents"]:
            failing_ids.add(external_id)
            raise RuntimeError("a bug in the capability's verify")
        return original(capability, slug, external_id, args, **kw)

    monkeypatch.setattr(dispatch, "observe_answer", raising)

    dispatch_batch.tool_calls_dispatch_batch(items_of([failing, fine]))

    assert failing_ids  # it was observed, and raised
    assert fresh(fine).verification_status == "confirmed_success"
    recorded = fresh(failing)
    assert (recorded.execution_status, recorded.verification_status) == ("completed", "pending")
    assert recorded.receipts.count() == 1
    message = verification_message(failing)
    assert message.done_at is None  # the safety net: the sweeper publishes it
    verify.tool_call_verify(tool_call_id=failing.pk, outbox_id=message.pk)
    assert fresh(failing).verification_status == "confirmed_success"
    assert_log_matches_state()


def test_an_observation_that_hangs_does_not_hold_the_record_back(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow, fine = refunds(run, 2)
    monkeypatch.setattr(dispatch, "OBSERVE_SECONDS", 0.3)
    original = dispatch.observe_answer

    def hanging(capability: Any, slug: str, external_id: str, args: Any, **kw: Any) -> str:
        if args["amount_cents"] == slow.args["amount_cents"]:
            time.sleep(3)
        return original(capability, slug, external_id, args, **kw)

    monkeypatch.setattr(dispatch, "observe_answer", hanging)

    started = time.monotonic()
    dispatch_batch.tool_calls_dispatch_batch(items_of([slow, fine]))

    assert time.monotonic() - started < 2.5  # recorded without waiting for the slow one
    assert fresh(fine).verification_status == "confirmed_success"
    recorded = fresh(slow)
    assert (recorded.execution_status, recorded.verification_status) == ("completed", "pending")
    assert verification_message(slow).done_at is None


def test_a_verify_that_raises_keeps_the_record_and_verifies_apart(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = refunds(run, 2)
    original = dispatch_batch.judge
    judged: list[str] = []

    def broken(tool_call_id: str, *args: Any, **kwargs: Any) -> None:
        judged.append(tool_call_id)
        if tool_call_id == bad.pk and len(judged) <= 2:
            raise RuntimeError("a bug in one call's judgment")
        original(tool_call_id, *args, **kwargs)

    monkeypatch.setattr(dispatch_batch, "judge", broken)

    dispatch_batch.tool_calls_dispatch_batch(items_of([good, bad]))

    # The combined transaction rolled back; both answers were recorded again without it, and
    # verified in a transaction of their own.
    for call in (good, bad):
        assert fresh(call).execution_status == "completed"
        assert fresh(call).verification_status == "confirmed_success"
        assert fresh(call).attempts.get().classification == "confirmed"
        assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


def test_a_confirmed_call_wakes_its_dependents_in_the_record_transaction(
    run: Run, sandbox: Sandbox
) -> None:
    first, second = refunds(run, 2)
    waiting = propose_in(
        run, {**REFUND, "amount_cents": 99}, intent="waiting", depends_on=[first.pk]
    )
    dispatch.tool_call_dispatch(tool_call_id=waiting.pk)
    undone = OutboxMessage.objects.filter(task=DISPATCH_TASK, args__0=waiting.pk, done_at=None)
    undone.update(done_at="2026-01-01T00:00:00Z")

    dispatch_batch.tool_calls_dispatch_batch(items_of([first, second]))

    assert undone.count() == 1  # woken by its dependency's confirmation
    dispatch.tool_call_dispatch(tool_call_id=waiting.pk, outbox_id=undone.get().pk)
    assert fresh(waiting).verification_status == "confirmed_success"


def test_a_row_saved_once_inside_saved_together_is_saved_by_it_and_forgotten(
    run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)
    with transaction.atomic():
        locked = ToolCall.objects.get(pk=call.pk)
        together = transitions.saved_together([locked])
        with CaptureQueriesContext(connection) as queries, together, transitions.saved_once(locked):
            locked.last_error_name = "tool.test"  # no transition: saved all the same
        alone = ToolCall.objects.get(pk=call.pk)
        with transitions.saved_once(alone):
            tool_call_transition(alone, "cancel", actor="t", producer="test")
    assert statements(queries)["UPDATE toolcalls_toolcall"] == 1
    assert fresh(call).last_error_name == "tool.test"
    assert fresh(call).execution_status == "cancelled"
    assert id(alone) not in transitions._touched()  # nothing left to name another row


def test_a_dependency_that_fails_in_the_claim_cancels_its_dependent_in_the_same_batch(
    run: Run, sandbox: Sandbox
) -> None:
    """The dependent's claim reads its dependency from the database: the batch's claims are
    saved one by one when a call has dependencies, so it reads the dependency failed."""
    moved = {**REFUND, "order_id": "order-003"}
    dependency = propose_in(run, moved, intent="dependency", object_revision=1)
    dependent = propose_in(run, intent="dependent", depends_on=[dependency.pk])
    ObjectRevision.objects.filter(ref="order:order-003").update(revision=2)

    dispatch_batch.tool_calls_dispatch_batch(items_of([dependency, dependent]))

    assert fresh(dependency).last_error_name == "precondition.conflict"
    assert fresh(dependent).execution_status == "cancelled"
    assert_log_matches_state()


# --- the single-call path -------------------------------------------------------------------


def test_the_single_path_records_and_verifies_in_one_transaction(
    run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)

    with CaptureQueriesContext(connection) as queries:
        dispatch.tool_call_dispatch(tool_call_id=call.pk, outbox_id=message_of(call).pk)

    locks = [q for q in queries.captured_queries if "FOR NO KEY UPDATE OF c" in q["sql"]]
    assert len(locks) == 2  # the claim's and the record's
    assert statements(queries)["UPDATE toolcalls_toolcall"] == 2
    assert fresh(call).verification_status == "confirmed_success"
    assert verification_message(call).done_at is not None
    assert_log_matches_state()


def test_the_single_path_records_an_answer_whose_observation_raised(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = propose_in(run)

    def raising(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("a bug in the capability's verify")

    monkeypatch.setattr(dispatch, "observe_answer", raising)

    dispatch.tool_call_dispatch(tool_call_id=call.pk, outbox_id=message_of(call).pk)

    recorded = fresh(call)
    assert (recorded.execution_status, recorded.verification_status) == ("completed", "pending")
    assert verification_message(call).done_at is None  # the sweeper publishes it
    monkeypatch.undo()
    verify.tool_call_verify(tool_call_id=call.pk, outbox_id=verification_message(call).pk)
    assert fresh(call).verification_status == "confirmed_success"


def test_the_single_path_keeps_the_answer_when_its_judgment_raises(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = propose_in(run)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in the judgment")

    monkeypatch.setattr(dispatch, "judge", broken)

    dispatch.tool_call_dispatch(tool_call_id=call.pk, outbox_id=message_of(call).pk)

    recorded = fresh(call)
    assert (recorded.execution_status, recorded.verification_status) == ("completed", "pending")
    assert recorded.attempts.get().classification == "confirmed"
    assert verification_message(call).done_at is None
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_log_matches_state()


def test_a_batchs_claim_reads_its_calls_readiness_with_their_lock(
    run: Run, sandbox: Sandbox
) -> None:
    other, _ = run_services.run_start(tenant=run.tenant, title="other", actor="test")
    calls = refunds(run, 2) + refunds(other, 2, first=2)
    items = items_of(calls)

    with CaptureQueriesContext(connection) as queries:
        claims = dispatch_batch.claim_batch(items)

    assert len(claims) == 4
    sent = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    # The lock (with the readiness), the messages done, the runs locked and their heads, the
    # calls' last events, the attempts, the claims' UPDATE, the events (9 with the readiness
    # read apart).
    assert not [s for s in sent if s.startswith("SELECT c.id, (SELECT count(*)")]
    assert len([s for s in sent if "FOR NO KEY UPDATE OF c SKIP LOCKED" in s]) == 1
    assert len(sent) == 8
    for call in calls:
        assert fresh(call).execution_status == "dispatching"


def test_a_batch_reads_its_rows_ids_without_model_pk(run: Run, sandbox: Sandbox) -> None:
    # `.pk` is a property and a getattr per read; `.id` is the row's value (the dispatch read
    # it about 38 times per call: profile_dispatch --profile).
    other, _ = run_services.run_start(tenant=run.tenant, title="other", actor="test")
    calls = refunds(run, 2) + refunds(other, 2, first=2)
    items = items_of(calls)
    profile = cProfile.Profile()
    profile.runcall(dispatch_batch.tool_calls_dispatch_batch, items)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    pk_reads = sum(row[1] for (_, _, name), row in stats.items() if name == "_get_pk_val")
    assert pk_reads <= 4  # before: 152 for these four calls
    for call in calls:
        assert fresh(call).verification_status == "confirmed_success"
    assert_log_matches_state()
