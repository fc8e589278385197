"""Workers reconnect on their own after PostgreSQL drops their connections (issue #10, 1).

Real worker and beat processes, the sandbox over HTTP, PostgreSQL and Redis: every backend of
the test database is terminated in the middle of a batch, as a database restart or failover
would, and every call still reaches its verified outcome with no process restarted.

The cut comes between calls (only beat's sweeps keep the workers busy) or during them; the
rest of the batch is proposed after it. Between calls, the next query of each worker is a
sweep's, outside a transaction: before the fix that left the worker with a closed connection
that every later task failed on ("the connection is closed"). A cut during a call happened to
recover, since Django drops a connection whose rollback fails; the calls cut mid-way still
have to reach their outcome (lease expiry, look-up).
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from tests.celery_processes import CeleryProcess
from tests.conftest import ApiClient
from tests.helpers import wait_for
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BATCH = 12


def propose_refunds(agent: ApiClient, run_id: str, numbers: range) -> list[str]:
    ids = []
    for n in numbers:
        args = {"order_id": f"order-{n:03d}", "amount_cents": 1000, "currency": "USD"}
        response = agent.post(
            f"/api/v1/runs/{run_id}/tool-calls",
            {"capability": "refund-order-v2", "args": args, "intent": f"intent-{n}"},
        )
        assert response.status_code == 201, response.json()
        ids.append(response.json()["tool_call_id"])
    return ids


def in_flight(ids: list[str]) -> int:
    return ToolCall.objects.filter(pk__in=ids, execution_status="dispatching").count()


def confirmed(ids: list[str]) -> int:
    return ToolCall.objects.filter(pk__in=ids, verification_status="confirmed_success").count()


def other_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def terminate_every_other_backend() -> int:
    """What a database restart does to every connection but this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def pids(processes: list[CeleryProcess]) -> set[int]:
    """The worker and beat processes and the pool processes where tasks run."""
    found = {process.process.pid for process in processes}
    for process in processes:
        found.update(process.children())
    return found


def tasks_run_since(worker: CeleryProcess, offset: int) -> int:
    log = worker.output()[offset:]
    return log.count(" succeeded in ") + log.count(" raised unexpected: ")


@pytest.mark.parametrize("cut", ["between_calls", "during_calls"])
def test_workers_reconnect_after_the_database_drops_their_connections(
    agent: ApiClient, sandbox: Sandbox, start_celery, cut: str
) -> None:
    workers = [start_celery("worker"), start_celery("worker")]
    processes = [*workers, start_celery("beat")]
    before = pids(processes)
    # Both workers hold a connection before the cut (beat's sweeps reach each within seconds):
    # a batched dispatch may otherwise run the whole first half on one worker.
    wait_for(lambda: other_backends() >= len(workers), 30, "both workers to connect")
    # Slow payments: calls are still on their way when the connections are cut mid-call.
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=0.4)
    run_id = agent.post("/api/v1/runs", {"title": "reconnect"}).json()["run_id"]
    first_half = propose_refunds(agent, run_id, range(1, BATCH // 2 + 1))
    if cut == "between_calls":
        wait_for(lambda: confirmed(first_half) == len(first_half), 40, "the first half", 0.1)
    else:
        # Requests at the payment gateway: a batched dispatch sends the half together, so the
        # calls are all in flight at once (waiting for two confirmed would wait for them all).
        wait_for(lambda: in_flight(first_half) >= 2, 40, "calls in flight", interval=0.05)
        assert confirmed(first_half) < len(first_half), "the first half ended before the cut"

    # Both workers' pool processes hold a connection (persistent connections).
    offsets = [len(worker.output()) for worker in workers]
    assert terminate_every_other_backend() >= len(workers)
    # Each worker runs a task (beat's sweeps, every second) on its dropped connection.
    wait_for(
        lambda: all(tasks_run_since(w, o) >= 2 for w, o in zip(workers, offsets, strict=True)),
        20,
        "each worker to run tasks after the cut",
    )

    second_half = propose_refunds(agent, run_id, range(BATCH // 2 + 1, BATCH + 1))
    ids = first_half + second_half
    wait_for(lambda: confirmed(ids) == BATCH, 60, "every call to be confirmed", interval=0.5)
    assert pids(processes) == before  # nothing restarted: the same processes recovered
    for call in ToolCall.objects.filter(pk__in=ids):
        assert call.execution_status == "completed", call.pk
        assert len(sandbox.effects_for(call.external_request_id)) == 1, call.pk
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")
