"""approvals/sql.py counts a tenant's pending approvals as the ORM counts them: the number
in every page's navigation."""

from __future__ import annotations

import pytest

from approvals import sql
from approvals.models import Approval
from runs.models import Run, Tenant
from tests.helpers import BIG_REFUND, propose_in
from tests.sandbox_process import Sandbox

pytestmark = pytest.mark.django_db


def _orm(tenant: Tenant) -> int:
    return Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING).count()


def test_it_counts_what_the_orm_counts(
    run: Run, tenant: Tenant, other_tenant: Tenant, sandbox: Sandbox
) -> None:
    assert sql.pending_count(tenant.pk) == 0
    for n in range(3):
        propose_in(run, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"big-{n}")
    Approval.objects.filter(pk=Approval.objects.order_by("id").first().pk).update(
        state=Approval.State.EXPIRED
    )

    assert sql.pending_count(tenant.pk) == _orm(tenant) == 2
    assert sql.pending_count(other_tenant.pk) == _orm(other_tenant) == 0
