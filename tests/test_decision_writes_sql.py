"""Three of the approve POST's round trips saved (issue 12: an approver's click). The decisions so
far and the decision's INSERT are one statement (approvals/sql.py record_decision), which writes the
row the ORM's `create` wrote, and which answers "another approval of the run still pending?" for
the decision's resume when the run is locked already (the decision's lock statement took it);
otherwise the run's resume asks "any approval still pending?" in the statement that locks the
run, only when the transaction holds the run's lock already (its events' batch took it), and
asks it after the lock, a statement apart, otherwise (toolcalls/lifecycle.py). With the run
named, the same statement reads the run's chain head, as runs/sql.py lock_and_read_head did
for the decision's events in a statement of its own."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals import sql as approvals_sql
from approvals.models import Approval, ApprovalDecision
from runs import events
from runs import sql as runs_sql
from runs.events import verify_chain
from runs.models import Event, Run, User
from tests.helpers import BIG_REFUND, decide, logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import lifecycle, sql_decision
from toolcalls import sql as toolcalls_sql

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(run: Run, sandbox: Sandbox) -> Approval:
    return Approval.objects.get(tool_call=propose_in(run, BIG_REFUND))


def _row(decision: ApprovalDecision) -> dict[str, Any]:
    row = ApprovalDecision.objects.filter(pk=decision.pk).values().get()
    return {name: value for name, value in row.items() if name not in ("id", "user_id")}


def test_the_decision_is_read_and_written_in_one_statement_as_the_orm_did(
    waiting: Approval, approver: User, bob: User
) -> None:
    fields = {
        "approval": waiting,
        "decision": "approve_with_edits",
        "reason": "ok — checked",
        "summary_hash": waiting.summary_hash,
        "edit_diff": {"amount_cents": {"from": 25000, "to": 20000}},
    }
    by_orm = ApprovalDecision.objects.create(user=approver, **fields)
    written = ApprovalDecision(user=bob, **fields)
    with CaptureQueriesContext(connection) as queries:
        recorded = approvals_sql.record_decision(written)

    assert len(queries) == 1
    assert recorded.earlier == [(approver.pk, "approve_with_edits")]
    assert recorded.others_pending is None  # no run named: not asked
    assert written.pk is not None and written.pk > by_orm.pk
    assert not written._state.adding
    stored = ApprovalDecision.objects.get(pk=written.pk)
    assert (stored.user_id, stored.created_at) == (bob.pk, written.created_at)
    assert written.created_at >= by_orm.created_at
    assert {**_row(written), "created_at": None} == {**_row(by_orm), "created_at": None}
    # Oldest first, as the ORM's ordering (created_at, id) reads them.
    assert approvals_sql.decisions_so_far(waiting.pk) == list(
        waiting.decisions.values_list("user_id", "decision")
    )


def test_the_first_decision_finds_none_before_it_and_stores_null_without_an_edit(
    waiting: Approval, approver: User
) -> None:
    written = ApprovalDecision(
        approval=waiting, user=approver, decision="approve", summary_hash=waiting.summary_hash
    )
    assert approvals_sql.record_decision(written) == ([], None, None)
    assert ApprovalDecision.objects.filter(
        pk=written.pk, edit_diff__isnull=True, reason=""
    ).exists()


def test_a_persons_second_decision_is_not_written(waiting: Approval, approver: User) -> None:
    first = ApprovalDecision.objects.create(
        approval=waiting, user=approver, decision="approve", summary_hash=waiting.summary_hash
    )
    again = ApprovalDecision(
        approval=waiting, user=approver, decision="reject", summary_hash=waiting.summary_hash
    )
    assert approvals_sql.record_decision(again) is None
    assert again.pk is None and again._state.adding
    assert list(ApprovalDecision.objects.filter(approval=waiting)) == [first]


def test_the_held_runs_statement_answers_as_the_lock_and_the_pending_query(
    run: Run, waiting: Approval
) -> None:
    with transaction.atomic():
        locked = toolcalls_sql.lock_run(tenant_id=None, run_id=run.pk)
        with CaptureQueriesContext(connection) as queries:
            held, pending = sql_decision.held_run_and_pending(run.pk)
        assert len(queries) == 1
        assert pending is toolcalls_sql.approval_pending_in_run(run.pk) is True
        assert {f.attname: getattr(held, f.attname) for f in Run._meta.concrete_fields} == {
            f.attname: getattr(locked, f.attname) for f in Run._meta.concrete_fields
        }
        Approval.objects.filter(pk=waiting.pk).update(state="approved")
        assert sql_decision.held_run_and_pending(run.pk)[1] is False
        assert sql_decision.held_run_and_pending("run_missing") is None


def test_without_the_runs_lock_held_the_question_is_asked_after_the_lock(
    run: Run, waiting: Approval
) -> None:
    run.refresh_from_db()
    assert run.state == Run.State.WAITING
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        lifecycle.run_resume_if_unblocked(run_id=run.pk, actor="test", producer="test")
    statements = [q["sql"] for q in queries.captured_queries if "runs_run" in q["sql"]]
    # The lock, then "any approval pending?" a statement apart: it must see a decision that
    # committed while this transaction waited for the lock.
    assert len(statements) == 1 and "approvals_approval" not in statements[0]
    assert any("approvals_approval" in q["sql"] for q in queries.captured_queries)
    run.refresh_from_db()
    assert run.state == Run.State.WAITING


def test_with_the_runs_lock_held_one_statement_locks_and_asks(run: Run, waiting: Approval) -> None:
    Approval.objects.filter(pk=waiting.pk).update(state="approved")
    with transaction.atomic(), events.batch():
        # As a caller that locked the run and read its head says (toolcalls/sql.py run_tally).
        toolcalls_sql.lock_run(tenant_id=None, run_id=run.pk)
        head = Event.objects.filter(run=run).order_by("-seq").values("id", "seq", "hash").first()
        events.batch_knows_head(run.pk, head, [])
        assert events.batch_holds_run(run.pk)
        with CaptureQueriesContext(connection) as queries:
            lifecycle.run_resume_if_unblocked(run_id=run.pk, actor="test", producer="test")
        asked = [q["sql"] for q in queries.captured_queries]
        assert len(asked) == 2  # the lock with the question; the run's UPDATE
        assert "FOR UPDATE" in asked[0] and "approvals_approval" in asked[0]
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE


def test_the_decision_also_answers_whether_another_approval_of_its_run_is_pending(
    run: Run, waiting: Approval, approver: User, bob: User
) -> None:
    """Asked with the run named (the decision holds its lock): the approval decided is left
    out, another of the run's still pending counts, as approval_pending_in_run would count it
    once the decision's own UPDATE made this one approved."""
    other = Approval.objects.get(tool_call=propose_in(run, {**BIG_REFUND, "order_id": "order-002"}))

    def record(user: User) -> approvals_sql.Recorded:
        decision = ApprovalDecision(
            approval=waiting, user=user, decision="approve", summary_hash=waiting.summary_hash
        )
        with CaptureQueriesContext(connection) as queries:
            recorded = approvals_sql.record_decision(decision, run_id=run.pk)
        assert len(queries) == 1
        return recorded

    assert record(approver)[:2] == ([], True)  # `other` is pending
    Approval.objects.filter(pk=other.pk).update(state="rejected")
    # Only `waiting` itself is pending now, and it is not counted.
    assert record(bob)[:2] == ([(approver.pk, "approve")], False)
    Approval.objects.filter(pk=waiting.pk).update(state="approved")
    assert toolcalls_sql.approval_pending_in_run(run.pk) is False


def test_the_decision_reads_the_runs_chain_head_as_the_heads_own_statement_did(
    run: Run, waiting: Approval, approver: User
) -> None:
    call_id = waiting.tool_call_id
    # Another call's event after this call's last: the run's head and the call's last differ.
    other = propose_in(run, {**BIG_REFUND, "order_id": "order-002"})
    assert Event.objects.filter(run=run).order_by("-seq").first().tool_call_id == other.pk
    with transaction.atomic():
        toolcalls_sql.lock_run(tenant_id=None, run_id=run.pk)
        expected = runs_sql.lock_and_read_head(run.pk, call_id, held=True)
        decision = ApprovalDecision(
            approval=waiting, user=approver, decision="approve", summary_hash=waiting.summary_hash
        )
        recorded = approvals_sql.record_decision(decision, run_id=run.pk)
    assert recorded.head == expected
    assert recorded.head.last["seq"] == Event.objects.filter(run=run).count()
    assert (
        recorded.head.last_of_call
        == (
            Event.objects.filter(tool_call_id=call_id)
            .order_by("-seq")
            .values_list("id", flat=True)[0]
        )
    )
    # Not asked without the run.
    again = ApprovalDecision(
        approval=waiting, user=approver, decision="approve", summary_hash=waiting.summary_hash
    )
    assert approvals_sql.record_decision(again) is None  # decided already: nothing read back


def test_the_decisions_events_take_the_head_it_read_and_chain_as_before(
    waiting: Approval, approver: User
) -> None:
    """The approve POST's transaction, its statements captured: the chain head is read in the
    decision's statement and in no statement of its own, and the events link up."""
    client = logged_in(approver)
    with CaptureQueriesContext(connection) as queries:
        response = decide(client, waiting, "approve")
    assert response.status_code == 302
    head_reads = [
        q["sql"] for q in queries.captured_queries if "FROM runs_event WHERE run_id" in q["sql"]
    ]
    assert len(head_reads) == 1 and "approvals_approvaldecision" in head_reads[0]
    stored = list(Event.objects.filter(run_id=waiting.run_id).order_by("seq"))
    assert verify_chain(stored) == []
    assert [e.event_type for e in stored[-4:]] == [
        "approval.decision_recorded",
        "approval.approved",
        "tool_call.authorized",
        "run.resumed",
    ]
