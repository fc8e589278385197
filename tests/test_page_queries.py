"""Every console page costs the same number of queries at two sizes of data: no query per row,
per event or per approval (issue #11's page rule; `bench_pages` measures the time)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from runs import services as run_services
from runs.models import Event, Run, Tenant, User
from tests.helpers import BIG_REFUND, logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch, gate
from toolcalls.models import E, ToolCall

HTMX = {"HX-Request": "true"}


def grow(tenant: Tenant, sandbox: Sandbox, people: dict[str, User], runs: int) -> None:
    """`runs` more runs, each as the bench's busy run in small: emails sent, one lost answer,
    a refund approved by a person, a big one left pending."""
    for n in range(runs):
        run, _ = run_services.run_start(tenant=tenant, title=f"grown {n}", actor="t")
        for i in range(3):
            args = {
                "order_id": "order-002",
                "to": "customer-002@example.com",
                "subject": "Your order",
                "body": f"Notice {i}.",
            }
            if i == 2:
                sandbox.faults(system="mailer", drop_response_after_commit=1.0, times=1)
            call = propose_in(run, args, capability="send-email-v1", intent=f"{run.pk}-{i}")
            dispatch.tool_call_dispatch(tool_call_id=call.pk)
        approved = propose_in(run, {**BIG_REFUND, "amount_cents": 20_100}, intent=f"{run.pk}-a")
        approval = Approval.objects.get(tool_call=approved)
        gate.tool_call_approve(
            tenant=tenant,
            approval_id=approval.pk,
            user=people["bob"],
            seen_version=approval.version,
            seen_summary_hash=approval.summary_hash,
        )
        dispatch.tool_call_dispatch(tool_call_id=approved.pk)
        propose_in(run, {**BIG_REFUND, "amount_cents": 20_200 + n}, intent=f"{run.pk}-p")


def pages(tenant: Tenant, person: str) -> dict[str, tuple[str, dict[str, str]]]:
    """The pages, on the first run, approval and unknown call (they exist at both sizes)."""
    run = Run.objects.filter(tenant=tenant).order_by("id").first()
    approval = Approval.objects.filter(tenant=tenant, state="pending").order_by("id").first()
    unknown = ToolCall.objects.filter(tenant=tenant, execution_status=E.RESULT_UNKNOWN).first()
    last = Event.objects.filter(run=run).order_by("-seq").first().seq
    return {
        "inbox": ("/approvals/", {}),
        "inbox poll": ("/approvals/?page=1", HTMX),
        "approval page": (f"/approvals/{approval.pk}/", {}),
        "runs list": ("/runs/", {}),
        "run page": (f"/runs/{run.pk}/", {}),
        "run page poll": (f"/runs/{run.pk}/?seen={last}", HTMX),
        "desk": ("/desk/", {}),
        "desk item": (f"/desk/{unknown.pk}/", {}),
        "audit": ("/audit/", {}),
        "audit by person": (f"/audit/?person={person}", {}),
        "audit by id": (f"/audit/?q={run.pk}", {}),
        "dashboard": ("/dashboard/", {}),
        "metrics": ("/metrics", {}),
    }


def queries_of(client: Client, path: str, headers: dict[str, str]) -> int:
    client.get(path, headers=headers)  # the session and the user are read once, not counted
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, headers=headers)
    assert response.status_code in (200, 204), (path, response.status_code)
    return len(captured.captured_queries)


@pytest.fixture
def measure(tenant: Tenant, admin_user: User) -> Callable[[], dict[str, int]]:
    client = logged_in(admin_user)

    def counts() -> dict[str, int]:
        return {
            name: queries_of(client, path, headers)
            for name, (path, headers) in pages(tenant, "bob").items()
        }

    return counts


def test_each_page_costs_the_same_queries_with_three_times_the_data(
    tenant: Tenant, sandbox: Sandbox, bob: User, measure: Callable[[], dict[str, int]]
) -> None:
    people = {"bob": bob}
    grow(tenant, sandbox, people, 1)
    small = measure()
    grow(tenant, sandbox, people, 2)
    assert Approval.objects.filter(tenant=tenant, state="pending").count() == 3
    assert measure() == small
