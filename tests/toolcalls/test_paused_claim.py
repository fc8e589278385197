"""A worker stopped inside its claim does not freeze its run (issue #10, 5).

Real worker and beat processes, the sandbox over HTTP, PostgreSQL and Redis. The first worker
to claim a call stops itself (SIGSTOP) at the fault point `inside_claim`: its claim's
transaction is open and holds the call's row lock and the run's (the claim event locked the
run row). Every proposal of that run needs the run's row lock. PostgreSQL ends the stopped
session once it has been idle in its transaction for DATABASE_IDLE_IN_TRANSACTION_TIMEOUT,
which rolls the claim back and releases the locks; the other proposals then go through, and
the call, still `authorized` with its outbox message undone, is sent again by the other worker.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from tests.conftest import ApiClient
from tests.helpers import REFUND, propose, start_run, tool_call_of, wait_for
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Set in the workers' environment only: the test settings turn the limit off unless it is set.
IDLE_LIMIT_SECONDS = 3


def process_state(pid: int) -> str:
    """R, S, T (stopped) … from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as handle:
        stat = handle.read()
    return stat[stat.rindex(")") + 2]


def sessions_idle_in_transaction() -> list[int]:
    """Backends of the test database idle inside a transaction for a while (a worker between
    two statements of a claim is idle in it for a few milliseconds)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle in transaction' AND now() - state_change > interval '200 ms'"
        )
        return [row[0] for row in cursor.fetchall()]


def backend_alive(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone() is not None


def propose_timed(agent: ApiClient, run_id: str, n: int) -> float:
    """Another refund in the run, through the API; must answer 201. Returns its seconds."""
    started = time.monotonic()
    response = agent.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {
            "capability": "refund-order-v2",
            "args": {**REFUND, "amount_cents": 100 + n},
            "intent": f"other-{n}",
        },
    )
    assert response.status_code == 201, response.content[:300]
    return time.monotonic() - started


def confirmed(call: ToolCall) -> bool:
    return ToolCall.objects.get(pk=call.pk).verification_status == "confirmed_success"


def test_a_worker_stopped_inside_its_claim_does_not_freeze_its_run(
    agent: ApiClient, sandbox: Sandbox, start_celery, tmp_path: Path
) -> None:
    marker = tmp_path / "inside_claim.paused"
    env = {
        "COUNTERSIGN_PAUSE_AT": f"inside_claim:{marker}",
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT": f"{IDLE_LIMIT_SECONDS}s",
    }
    workers = [start_celery("worker", **env), start_celery("worker", **env)]
    start_celery("beat")
    run_id = start_run(agent)
    stuck = tool_call_of(propose(agent, REFUND, run_id=run_id, intent="stuck"))

    wait_for(marker.exists, 30, "a worker to stop inside its claim", interval=0.05)
    paused = [pid for w in workers for pid in w.children() if process_state(pid) == "T"]
    assert len(paused) == 1, "exactly one pool process is stopped"
    wait_for(
        lambda: len(sessions_idle_in_transaction()) == 1,
        IDLE_LIMIT_SECONDS - 1,
        "the stopped worker's claim to sit idle in its transaction, holding its locks",
        interval=0.05,
    )
    holders = sessions_idle_in_transaction()

    # The run's other proposals wait for the run's row lock at most until the server ends the
    # stopped session. The bound is that idle limit plus slack for a shared machine, not a
    # speed target; without the limit they wait lock_timeout (5 s) and get 503 database.busy.
    answered = [propose_timed(agent, run_id, n) for n in range(3)]
    print(f"proposals answered in {', '.join(f'{s:.2f} s' for s in answered)}")
    assert max(answered) < IDLE_LIMIT_SECONDS + 12
    wait_for(lambda: not backend_alive(holders[0]), 15, "the server to end the stopped session")

    # The claim was rolled back with its session: the call is still authorized, its outbox
    # message undone, and it goes out again (republished, or redelivered by Redis) to the
    # worker that is running.
    others = list(ToolCall.objects.filter(run_id=run_id).exclude(pk=stuck.pk))
    for call in [stuck, *others]:
        wait_for(lambda call=call: confirmed(call), 60, f"{call.pk} to be confirmed", interval=0.3)
    stuck = ToolCall.objects.get(pk=stuck.pk)
    assert stuck.execution_status == "completed"
    assert stuck.attempts.count() == 1  # the stopped claim's attempt was never committed

    # The stopped worker wakes up with its session gone: its commit fails, nothing is sent.
    stopped = next(w for w in workers if paused[0] in w.children())
    stopped.signal_pool(signal.SIGCONT)
    wait_for(lambda: "raised unexpected" in stopped.output(), 30, "the late claim to fail")
    for call in [stuck, *others]:
        assert len(sandbox.effects_for(call.external_request_id)) == 1, call.pk
    assert ToolCall.objects.get(pk=stuck.pk).attempts.count() == 1
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")
