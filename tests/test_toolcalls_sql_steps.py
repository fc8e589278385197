"""toolcalls/sql.py reads the run page's attempts and receipts of a page of calls in one
statement, as the two ORM queries read them: the same tuples, in the same order."""

from __future__ import annotations

import pytest

from runs.models import Run
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch, sql
from toolcalls.models import Attempt, Receipt

pytestmark = pytest.mark.django_db


def _email(n: int) -> dict[str, str]:
    return {
        "order_id": "order-002",
        "to": "customer-002@example.com",
        "subject": "s",
        "body": f"b{n}",
    }


def test_it_reads_what_the_orm_reads(run: Run, sandbox: Sandbox) -> None:
    calls = [
        propose_in(run, _email(n), capability="send-email-v1", intent=f"i{n}") for n in range(3)
    ]
    sandbox.faults(system="mailer", drop_response_after_commit=1.0, times=1)
    for call in calls[:2]:
        dispatch.tool_call_dispatch(tool_call_id=call.pk)
    ids = [call.pk for call in calls]
    assert Attempt.objects.filter(tool_call_id__in=ids).exists()
    assert Receipt.objects.filter(tool_call_id__in=ids).exists()

    steps = sql.call_steps(ids)

    empty = {pk: {"attempts": [], "receipts": []} for pk in ids}
    assert steps == sql._call_steps_orm(ids, empty)
    assert steps[calls[2].pk] == {"attempts": [], "receipts": []}
    assert sql.call_steps([]) == {}
