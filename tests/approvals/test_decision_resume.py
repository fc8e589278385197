"""A decision resumes its waiting run only once no other approval of the run is pending. The
question is answered by the decision's own statement (approvals/sql.py record_decision, with the
run locked by the decision's lock statement), not by a statement of the resume's: these fail if
that answer is wrong either way."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection

from approvals.models import Approval
from runs.models import Event, Run, User
from tests.helpers import BIG_REFUND, decide, logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import gate

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_waiting(run: Run, sandbox: Sandbox) -> tuple[Approval, Approval]:
    """Two refunds over $200 of different orders in one run, each waiting for its approver."""
    first = propose_in(run, BIG_REFUND, intent="first")
    second = propose_in(run, {**BIG_REFUND, "order_id": "order-002"}, intent="second")
    return Approval.objects.get(tool_call=first), Approval.objects.get(tool_call=second)


def _resumes(run: Run) -> int:
    return Event.objects.filter(run=run, event_type="run.resumed").count()


def test_the_run_waits_while_another_approval_is_pending_and_resumes_after_the_last(
    run: Run, two_waiting: tuple[Approval, Approval], approver: User
) -> None:
    first, second = two_waiting
    client = logged_in(approver)
    assert decide(client, first, "approve").status_code == 302
    run.refresh_from_db()
    assert (run.state, _resumes(run)) == (Run.State.WAITING, 0)

    assert decide(client, second, "approve").status_code == 302
    run.refresh_from_db()
    assert (run.state, _resumes(run)) == (Run.State.ACTIVE, 1)


def test_a_rejection_resumes_the_run_only_after_the_last_pending_approval(
    run: Run, two_waiting: tuple[Approval, Approval], approver: User
) -> None:
    first, second = two_waiting
    client = logged_in(approver)
    assert decide(client, first, "reject", reason="not this one").status_code == 302
    run.refresh_from_db()
    assert run.state == Run.State.WAITING

    assert decide(client, second, "reject", reason="nor this").status_code == 302
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE


@pytest.mark.django_db(transaction=True)
def test_a_decision_that_waited_for_the_runs_lock_sees_the_decision_before_it(
    run: Run, two_waiting: tuple[Approval, Approval], approver: User
) -> None:
    """The last two approvals decided at once: the second decision waits for the run's lock
    (its lock statement) while the first holds it; once the first commits, the second must see
    its approval decided, or the run would wait for ever. The question is asked by a statement
    that starts after the lock was granted (approvals/sql.py record_decision), so it does."""
    first, second = two_waiting
    db = connection.settings_dict
    params = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": db["NAME"]}
    with psycopg.connect(**params) as holder, psycopg.connect(**params, autocommit=True) as watch:
        # The first decision, as far as this test needs it: the run locked, its approval decided.
        holder.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run.pk])
        holder.execute("UPDATE approvals_approval SET state = 'approved' WHERE id = %s", [first.pk])
        done: list[Any] = []

        def decide_second() -> None:
            try:
                done.append(
                    gate.tool_call_approve(
                        tenant=run.tenant,
                        approval_id=second.pk,
                        user=approver,
                        seen_version=second.version,
                        seen_summary_hash=second.summary_hash,
                    )
                )
            finally:
                connection.close()

        thread = threading.Thread(target=decide_second)
        thread.start()
        waits = "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)"
        for _ in range(600):
            if watch.execute(waits).fetchone()[0]:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the second decision never waited for the run's lock")
        holder.commit()
        thread.join(timeout=60)
    assert done and done[0].state == Approval.State.APPROVED
    run.refresh_from_db()
    assert run.state == Run.State.ACTIVE
