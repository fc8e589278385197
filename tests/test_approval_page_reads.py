"""The approval page reads its approval, with the call, the call's decision, the run, the
policy and the requester, by one written-out statement (console/sql.py approval_for_page) that
reads what approvals.selectors.approval_get's select_related reads."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import selectors
from approvals.models import Approval
from console import sql
from runs.models import Decision, Run, Tenant, User
from tests.helpers import BIG_REFUND, logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="console/sql.py is PostgreSQL's"
)


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _related(approval: Approval) -> list[Any]:
    call = approval.tool_call
    return [call, call.decision, approval.run, approval.policy, approval.requested_by]


def test_it_reads_what_select_related_reads(
    tenant: Tenant, other_tenant: Tenant, run: Run, owner: User, sandbox: Sandbox
) -> None:
    decided, bare = (
        propose_in(run, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"i{n}")
        for n in range(2)
    )
    decision = Decision.objects.create(run=run, kind="refund", content={"why": "late <b>"})
    ToolCall.objects.filter(pk=decided.pk).update(decision=decision)
    Approval.objects.filter(tool_call=decided).update(requested_by=owner)
    Approval.objects.filter(tool_call=bare).update(requested_by=None)
    for call in (decided, bare):
        approval_id = Approval.objects.get(tool_call=call).pk
        with CaptureQueriesContext(connection) as queries:
            read = sql.approval_for_page(tenant_id=tenant.pk, approval_id=approval_id)
            related = _related(read)  # no further query
        assert len(queries) == 1
        orm = selectors.approval_get(tenant=tenant, approval_id=approval_id)
        assert _values(read) == _values(orm)
        for ours, theirs in zip(related, _related(orm), strict=True):
            assert (ours and _values(ours)) == (theirs and _values(theirs))
    read = sql.approval_for_page(tenant_id=tenant.pk, approval_id=approval_id)
    assert read.tool_call.decision is None and read.requested_by is None
    assert read.args == Approval.objects.get(pk=approval_id).args
    approval_id = Approval.objects.get(tool_call=decided).pk
    read = sql.approval_for_page(tenant_id=tenant.pk, approval_id=approval_id)
    assert read.tool_call.decision.content == {"why": "late <b>"}
    assert read.requested_by.username == owner.username
    # Another tenant's approval, and no approval at all.
    assert sql.approval_for_page(tenant_id=other_tenant.pk, approval_id=approval_id) is None
    assert sql.approval_for_page(tenant_id=tenant.pk, approval_id="apr_missing") is None


def test_the_page_of_another_tenants_approval_is_not_found(
    run: Run, other_tenant: Tenant, sandbox: Sandbox
) -> None:
    approval = Approval.objects.get(tool_call=propose_in(run, BIG_REFUND))
    stranger = User.objects.create_user("mallory", tenant=other_tenant, role="approver")
    assert logged_in(stranger).get(f"/approvals/{approval.pk}/").status_code == 404
    assert logged_in(stranger).get("/approvals/apr_missing/").status_code == 404
