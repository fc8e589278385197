"""Approval latency is kept as counts in the deciding transaction (approvals/latency.py);
/metrics reads them, and they equal what the log says, after a rebuild too."""

from __future__ import annotations

from django.core.management import call_command

from approvals import latency
from approvals.models import Approval, ApprovalLatency
from console import metrics
from runs.models import Run, Tenant, User
from runs.projections import verify
from tests.helpers import BIG_REFUND, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import gate


def decide(tenant: Tenant, run: Run, person: User, n: int, *, approve: bool) -> None:
    call = propose_in(run, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"l{n}")
    approval = Approval.objects.get(tool_call=call)
    decision = gate.tool_call_approve if approve else gate.tool_call_reject
    decision(
        tenant=tenant,
        approval_id=approval.pk,
        user=person,
        seen_version=approval.version,
        seen_summary_hash=approval.summary_hash,
        reason="checked",
    )


def test_each_decision_is_counted_as_the_log_says(
    tenant: Tenant, run: Run, bob: User, sandbox: Sandbox, capsys
) -> None:
    decide(tenant, run, bob, 1, approve=True)
    decide(tenant, run, bob, 2, approve=False)
    propose_in(run, {**BIG_REFUND, "amount_cents": 20_300}, intent="pending")
    assert sum(row.count for row in ApprovalLatency.objects.all()) == 2
    assert latency.stored() == latency.recount()
    histogram = metrics.collect(tenant=tenant)[tenant.slug].approval_latency
    assert histogram.count == 2 and histogram.cumulative[-1] == 2  # both within a day
    assert histogram.total == sum(total for _, total in latency.recount().values()) / 1e6
    call_command("rebuild_projections", "--verify")
    assert "approval_latency match the stored rows" in capsys.readouterr().out


def test_a_count_that_drifted_is_found_and_rebuilt_from_the_log(
    tenant: Tenant, run: Run, bob: User, sandbox: Sandbox
) -> None:
    decide(tenant, run, bob, 1, approve=True)
    ApprovalLatency.objects.update(count=5)
    problems = verify()
    assert len(problems) == 1 and problems[0].startswith("approval_latency"), problems
    latency.rebuild()
    assert verify() == []
    assert sum(row.count for row in ApprovalLatency.objects.all()) == 1
