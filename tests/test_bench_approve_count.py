"""bench_approve counts the approve POST's statements without Django's debug cursor (which
renders each one's SQL, CPU a real request never spends): the same count as
CaptureQueriesContext's inside a transaction (a test's: savepoints, counted by both; in the
benchmark's autocommit, CaptureQueriesContext also counts the decision's BEGIN and COMMIT)."""

from __future__ import annotations

import pytest
from django.contrib.messages.storage.cookie import CookieStorage
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from bench.approve_drive import CommitTimer, QueryCount
from runs.models import Run, Tenant, User
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
    # The decision's six writes after its reads go in one round trip (runs/pipeline.py).
    assert counted.round_trips == counted.count - 5


def test_the_posts_flash_is_in_the_cookie_the_benchmark_drops_after_each_click(
    run: Run, sandbox: Sandbox, approver: User
) -> None:
    """bench_approve drops the messages cookie after each click, as the approval page a browser
    is redirected to consumes the flash; kept, each POST decoded and re-signed every flash
    before it. The flash is in that cookie (signed: one flash as long as the next), and nothing
    else the next POST needs is."""
    client = logged_in(approver)
    first, second = (
        Approval.objects.get(tool_call=propose_in(run, args, intent=intent))
        for args, intent in ((BIG_REFUND, "a"), ({**BIG_REFUND, "order_id": "order-002"}, "b"))
    )
    assert decide(client, first, "approve").status_code == 302
    one_flash = len(client.cookies[CookieStorage.cookie_name].value)
    client.cookies.pop(CookieStorage.cookie_name)
    assert decide(client, second, "approve").status_code == 302
    assert len(client.cookies[CookieStorage.cookie_name].value) == one_flash
    second.refresh_from_db()
    assert second.state == "approved"


@pytest.mark.django_db(transaction=True)
def test_the_commit_timer_times_each_commit_and_leaves_the_connection_as_it_was() -> None:
    """bench_approve's per-click COMMIT time is what Django's outermost atomic block sends:
    one per transaction, none for a savepoint's release, and the connection's own method is
    back once the timer is removed."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    timer = CommitTimer(wrapper)
    try:
        with transaction.atomic():
            Tenant.objects.create(slug="timed", name="Timed")
            with transaction.atomic():  # a savepoint: released, not committed
                Tenant.objects.filter(slug="timed").update(name="Timed again")
        assert timer.count == 1 and timer.ms > 0
        Tenant.objects.filter(slug="timed").update(name="Autocommitted")  # no COMMIT sent
        assert timer.count == 1
    finally:
        timer.remove()
    assert "_commit" not in vars(wrapper)
    with transaction.atomic():
        Tenant.objects.create(slug="untimed", name="Untimed")
    assert timer.count == 1
