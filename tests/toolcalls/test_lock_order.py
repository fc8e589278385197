"""A proposal that depends on a call does not wait for whoever holds that call's lock.

Found by `manage.py soak`: a dispatch holds its call's row lock and then needs the run's to
append its event; a proposal in the same run that depends on that call holds the run's row
lock and, at commit, PostgreSQL's foreign-key check of the new dependency row asks for a
KEY SHARE lock on the call. Each waited for the other: `deadlock detected`, a 500 at the
API or a rolled-back task (231 of them in six minutes of soak). A call's lock must not
block a reference to the call, only other writers of it.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from runs.models import Run
from tests.helpers import REFUND, propose_in
from tests.sandbox_process import Sandbox
from toolcalls.writes import tool_call_lock

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_dependent_proposal_commits_while_a_worker_holds_the_call(
    run: Run, sandbox: Sandbox
) -> None:
    first = propose_in(run)
    locked, release = threading.Event(), threading.Event()

    def worker() -> None:
        """A dispatch between its lock of the call and its append to the run."""
        try:
            with transaction.atomic():
                tool_call_lock(first.pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert locked.wait(10)
        # Before: the commit waited for the worker's lock until lock_timeout (5 s) ended it.
        second = propose_in(
            run, {**REFUND, "amount_cents": 300}, intent="after", depends_on=[first.pk]
        )
        assert not release.is_set()  # the worker still held the call when this committed
    finally:
        release.set()
        thread.join()
    assert list(second.depends_on.values_list("pk", flat=True)) == [first.pk]
