"""The run page's and the approval page's feedback lists, read by written-out SQL on
PostgreSQL (memory/sql.py), are the ORM's rows in the ORM's order, as equal instances."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from approvals.models import Approval
from memory import feedback
from memory.models import Feedback
from runs import services
from runs.models import Run, Tenant

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="memory/sql.py is PostgreSQL's"
)


def _values(rows: list[Any]) -> list[dict[str, Any]]:
    return [{f.attname: getattr(r, f.attname) for f in r._meta.concrete_fields} for r in rows]


def test_the_lists_are_the_orms(tenant: Tenant, run: Run) -> None:
    other, _ = services.run_start(tenant=tenant, title="other", actor="t")
    facts = [
        (run, "approval", "apr_2", 2, "wrong_amount", 'too <b>"much"</b>'),
        (run, "run", run.pk, 5, "", ""),
        (run, "approval", "apr_1", None, "fine", ""),
        (run, "tool_call", "apr_1", 1, "", "same id, another kind"),
        (run, "approval", "apr_1", 4, "", "later"),
        (other, "approval", "apr_1", 3, "", "another run"),
    ]
    for of_run, kind, subject, rating, label, text in facts:
        Feedback.objects.create(
            tenant=tenant, run=of_run, subject_kind=kind, subject_id=subject, rating=rating,
            label=label, text=text, actor="user:alice",
        )  # fmt: skip
    ours = feedback.run_feedback(run=run)
    assert _values(ours) == _values(feedback.run_feedback_orm(run=run))
    assert len(ours) == 5
    for approval_id in ("apr_1", "apr_2", "apr_3"):
        approval = Approval(id=approval_id, run=run)
        ours = feedback.approval_feedback(approval=approval)
        assert _values(ours) == _values(feedback.approval_feedback_orm(approval=approval))
    apr_1 = feedback.approval_feedback(approval=Approval(id="apr_1", run=run))
    # Ids sort by the millisecond they were made in, at random within one (runs/ids.py): two
    # facts made in the same millisecond come in either order, so only the id order is asked.
    assert sorted(fact.text for fact in apr_1) == ["", "later"]
    assert [fact.id for fact in apr_1] == sorted(fact.id for fact in apr_1)
