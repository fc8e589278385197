"""WORKER_NICE: the bulk worker (Procfile) runs below normal CPU priority, so that on saturated
cores the web process and the `interactive` worker are scheduled before bulk work (issue 12;
bench_approve measures the click). Real worker processes; the nice value is read from /proc."""

from __future__ import annotations

import os

import pytest

from tests.helpers import autogroup_nice, nice_of_every_thread

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_worker_with_worker_nice_runs_every_thread_and_child_at_it(start_celery) -> None:
    base = os.nice(0)
    worker = start_celery("worker", WORKER_NICE="10")
    pids = [worker.process.pid, *worker.children()]
    assert len(pids) == 2  # the main process and its pool's process (--concurrency 1)
    for pid in pids:
        assert nice_of_every_thread(pid) == {base + 10}


def test_a_worker_with_worker_nice_in_its_own_session_lowers_the_session_group(
    start_celery,
) -> None:
    # The test workers lead their own sessions, as the benchmarks' do: under autogroup
    # scheduling only the group's nice value ranks them against other processes.
    own_group = autogroup_nice(os.getpid())
    worker = start_celery("worker", WORKER_NICE="10")
    assert os.getsid(worker.process.pid) == worker.process.pid
    assert autogroup_nice(worker.process.pid) == 10
    assert autogroup_nice(os.getpid()) == own_group  # the test's own session is left alone


def test_a_worker_without_it_runs_at_normal_priority(start_celery) -> None:
    base = os.nice(0)
    worker = start_celery("worker", queues="interactive")
    for pid in [worker.process.pid, *worker.children()]:
        assert nice_of_every_thread(pid) == {base}
    assert autogroup_nice(worker.process.pid) == 0
