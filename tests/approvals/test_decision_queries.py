"""What an approver's click costs the database: the approve and reject POSTs, counted query by
query, so that a change which adds one to the approver's wait fails here (issue 12; the time
is `bench_approve`'s). Before the decision was slimmed, one approve POST took 40 queries; 22
before the approval's and the call's locks became one statement and the early read took in the
business check's read."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from runs import pipeline
from runs.models import Event, OutboxMessage, Run, Tenant, User
from tests.helpers import BIG_REFUND, decide, logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import Webhook

# The session with its person and their tenant (1, runs/sessions.py; two statements until the
# s30 round, runs/backends.py); the approval with the business
# check's read of the object's other calls, before any lock, in one statement (1:
# toolcalls/sql_decision.py, decision_read; two queries before); SAVEPOINT, the approval, the
# call and the run locked with whether a webhook wants the decision, in one statement (2:
# lock_for_decision; four queries before); the decisions so far with the new one's INSERT,
# "another approval of the run still pending?" and the run's chain head (1: approvals/sql.py
# record_decision; five before, the head a statement of its own until s27); the approval's and
# the call's UPDATE, the dispatch's outbox message (3); the run's UPDATE (1: the run as the
# lock loaded it, and the pending question answered already: two queries before the s16
# round, one until s18); the four events in one INSERT (1); the decision counted in the
# approval latency counts, a projection the dashboard reads (1); RELEASE SAVEPOINT (1).
APPROVE_QUERIES = 12


def click(client: Client, approval: Approval, action: str, **fields: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = decide(client, approval, action, **fields)
    assert response.status_code == 302, response.content[-2000:]
    return len(captured.captured_queries)


@pytest.fixture
def waiting(run: Run, sandbox: Sandbox) -> Approval:
    """A refund over $200 in a run waiting for its one approver."""
    return Approval.objects.get(tool_call=propose_in(run, BIG_REFUND))


def test_an_approve_that_reaches_quorum_costs_its_fixed_queries(
    waiting: Approval, approver: User
) -> None:
    assert click(logged_in(approver), waiting, "approve") == APPROVE_QUERIES
    waiting.refresh_from_db()
    assert waiting.state == "approved"
    kinds = list(
        Event.objects.filter(run=waiting.run).order_by("-seq").values_list("event_type", flat=True)
    )[:4]
    assert kinds == [
        "run.resumed",
        "tool_call.authorized",
        "approval.approved",
        "approval.decision_recorded",
    ]


def test_a_receiver_of_decisions_adds_one_outbox_message_not_the_deliveries(
    waiting: Approval, approver: User, tenant: Tenant
) -> None:
    Webhook.objects.create(
        tenant=tenant, url="https://hooks.example", event_types=["approval.decided"]
    )
    assert click(logged_in(approver), waiting, "approve") == APPROVE_QUERIES + 1
    assert OutboxMessage.objects.filter(
        task="toolcalls.approval_decided_webhooks", args=[waiting.pk]
    ).exists()


def test_the_first_of_two_approvers_costs_fewer(run: Run, sandbox: Sandbox, approver: User) -> None:
    call = propose_in(run, {**BIG_REFUND, "amount_cents": 120_000})
    approval = Approval.objects.get(tool_call=call)
    # No approval, authorization nor resume: the decision, its event and the version saved.
    assert click(logged_in(approver), approval, "approve") == 8
    approval.refresh_from_db()
    assert (approval.state, approval.version, approval.approvals_so_far) == ("pending", 2, 1)


def test_a_reject_costs_its_fixed_queries(waiting: Approval, approver: User) -> None:
    # As an approve that reaches quorum, less the authorization's writes.
    assert click(logged_in(approver), waiting, "reject", reason="not eligible") == 11
    waiting.refresh_from_db()
    assert waiting.state == "rejected"


def statements_of(client: Client, approval: Approval, action: str, **fields: Any) -> list:
    """(the statement's first words, whether it went in a pipeline's round trip) of a click."""
    seen: list[tuple[str, bool]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append((" ".join(sql.split()[:3]), pipeline.sending_together()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        response = decide(client, approval, action, **fields)
    assert response.status_code == 302, response.content[-2000:]
    return seen


def test_the_decisions_writes_go_to_the_database_in_one_round_trip(
    waiting: Approval, approver: User
) -> None:
    # After the reads (the lock; the decisions so far with the run's chain head), the approval's
    # UPDATE, the latency count, the call's UPDATE, the dispatch's outbox message, the run's
    # UPDATE and the four events are sent together: one wait for the server, not six
    # (runs/pipeline.py). Every statement is still run, in the order the code wrote it.
    seen = statements_of(logged_in(approver), waiting, "approve")
    together = [words for words, piped in seen if piped]
    assert together == [
        'UPDATE "approvals_approval" SET',
        "INSERT INTO approvals_approvallatency",
        'UPDATE "toolcalls_toolcall" SET',
        'INSERT INTO "runs_outboxmessage"',
        'UPDATE "runs_run" SET',
        'INSERT INTO "runs_event"',
    ]
    assert len(seen) == APPROVE_QUERIES
    first_piped = next(i for i, (_, piped) in enumerate(seen) if piped)
    assert all(piped for _, piped in seen[first_piped : first_piped + len(together)])
    waiting.refresh_from_db()
    assert waiting.state == "approved"


def test_a_rejects_writes_go_in_one_round_trip_too(waiting: Approval, approver: User) -> None:
    seen = statements_of(logged_in(approver), waiting, "reject", reason="not eligible")
    assert sum(piped for _, piped in seen) >= 4
    waiting.refresh_from_db()
    assert waiting.state == "rejected"
