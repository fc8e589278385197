"""bench_approve counts the approve POST's statements without Django's debug cursor (which
renders each one's SQL, CPU a real request never spends): the same count as
CaptureQueriesContext's inside a transaction (a test's: savepoints, counted by both; in the
benchmark's autocommit, CaptureQueriesContext also counts the decision's BEGIN and COMMIT)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from bench.approve_drive import QueryCount
from runs.models import Run, User
from tests.helpers import BIG_REFUND, decide, logged_in, propose_in
from tests.sandbox_process import Sandbox


def test_it_counts_the_posts_statements_as_capture_queries_does(
    run: Run, sandbox: Sandbox, approver: User
) -> None:
    approval = Approval.objects.get(tool_call=propose_in(run, BIG_REFUND))
    counted = QueryCount()
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(counted):
        assert decide(logged_in(approver), approval, "approve").status_code == 302
    assert counted.count == len(captured.captured_queries) > 10
