"""approvals/sql.py reads the decisions so far on an approval as the ORM's
`approval.decisions.values_list("user_id", "decision")` did, in one statement (the approve
POST: "did you decide already?" and the count of approvers)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import sql
from approvals.models import Approval, ApprovalDecision
from runs.models import Run, User
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox

pytestmark = pytest.mark.django_db


def test_the_decisions_so_far_read_as_the_orm_reads(
    run: Run, sandbox: Sandbox, approver: User, bob: User
) -> None:
    # Over $1,000: two approvers.
    call = propose_in(run, {"order_id": "order-003", "amount_cents": 120_000, "currency": "USD"})
    approval = Approval.objects.get(tool_call=call)
    assert sql.decisions_so_far(approval.pk) == []
    for person, kind in ((approver, "approve"), (bob, "reject")):
        ApprovalDecision.objects.create(
            approval=approval, user=person, decision=kind, summary_hash=approval.summary_hash
        )

    with CaptureQueriesContext(connection) as queries:
        read = sql.decisions_so_far(approval.pk)

    assert len(queries) == 1
    assert read == list(approval.decisions.values_list("user_id", "decision"))
    assert read == [(approver.pk, "approve"), (bob.pk, "reject")]
