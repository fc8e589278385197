"""Business invariants under injected faults, with real Celery worker and beat processes on
PostgreSQL and Redis and the sandbox over HTTP (DESIGN section 12): what only real processes
show — a worker killed at each step, a message redelivered after its worker died, the sandbox
and Redis restarted under load.

Each test asserts the sandbox's ledger (at most one effect per logical operation), the final
states, and that the state replayed from the log equals the stored state. The scenarios that
need no process of their own are proven in the test's thread, in tests/toolcalls/test_dispatch.py
(duplicate messages, a paused worker's stale result, the carrier's look-up lag, rate limits, a
5xx storm and the circuit, compensation) and tests/approvals/test_approvals.py (concurrent
dispatches of one call).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from tests.helpers import REFUND, propose, redis_down, tool_call_of, wait_for
from tests.sandbox_process import Sandbox
from toolcalls.connectors import SANDBOX_TOKENS
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def settled(call: ToolCall, timeout: float = 40, verification: str = "confirmed_success"):
    def done() -> bool:
        return ToolCall.objects.get(pk=call.pk).verification_status == verification

    wait_for(done, timeout, f"{call.pk} to reach {verification}", interval=0.3)
    return ToolCall.objects.get(pk=call.pk)


def assert_invariants(sandbox: Sandbox, *calls: ToolCall) -> None:
    for call in calls:
        assert len(sandbox.effects_for(call.external_request_id)) <= 1, call.pk
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def crash_at(point: str, tmp_path: Path) -> dict[str, str]:
    return {"COUNTERSIGN_CRASH_AT": f"{point}:{tmp_path / point}.crashed"}


def test_a_call_runs_through_worker_processes(agent, sandbox, start_celery) -> None:
    worker = start_celery("worker")
    call = settled(tool_call_of(propose(agent)))
    assert call.execution_status == "completed"
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)
    # The worker injected the credentials and logged none of them.
    assert "toolcalls.verify" in worker.output()
    assert not any(token in worker.output() for token in SANDBOX_TOKENS.values())


def test_a_worker_killed_before_sending(agent, sandbox, start_celery, tmp_path) -> None:
    start_celery("worker", **crash_at("before_send", tmp_path))
    start_celery("beat")
    call = settled(tool_call_of(propose(agent)))
    assert (tmp_path / "before_send.crashed").exists()
    assert [a.error_name for a in call.attempts.order_by("number")] == ["tool.lease_expired", ""]
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_a_worker_killed_after_the_system_committed(agent, sandbox, start_celery, tmp_path) -> None:
    start_celery("worker", **crash_at("after_send", tmp_path))
    start_celery("beat")
    call = settled(tool_call_of(propose(agent)))
    assert (tmp_path / "after_send.crashed").exists()
    # The lease expired, and the look-up found what the dead worker had done: no resend.
    assert call.attempts.count() == 1
    assert call.receipts.get().source == "lookup"
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_a_worker_killed_after_the_outcome_commit_before_the_ack(
    agent, sandbox, start_celery, tmp_path
) -> None:
    worker = start_celery("worker", **crash_at("before_ack", tmp_path))
    call = settled(tool_call_of(propose(agent)))
    # The message comes back (acks_late, reject_on_worker_lost) and finds nothing to do.
    wait_for(
        lambda: "WorkerLostError" in worker.output() or "SIGKILL" in worker.output(),
        15,
        "the worker to report its lost child",
    )
    time.sleep(2)
    assert ToolCall.objects.get(pk=call.pk).attempts.count() == 1
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_the_sandbox_restarted_mid_run(agent, sandbox, start_celery) -> None:
    start_celery("worker")
    start_celery("beat")
    # Slow answers keep calls in flight when the sandbox goes down under them.
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=0.5)
    calls = [
        tool_call_of(propose(agent, {**REFUND, "amount_cents": 200 + i}, intent=f"r{i}"))
        for i in range(3)
    ]
    sandbox.stop()
    time.sleep(2)  # the rest meet a closed port: retryable, nothing executed
    sandbox.start()  # with its state from disk, and no faults
    for call in calls:
        settled(call, timeout=60)
    assert len(sandbox.ledger("payments")) == 3
    assert_invariants(sandbox, *calls)


def test_redis_restarted_mid_run(agent, sandbox, start_celery) -> None:
    start_celery("worker")
    start_celery("beat")
    with redis_down(settings.CELERY_BROKER_URL):
        calls = [
            tool_call_of(propose(agent, {**REFUND, "amount_cents": 300 + i}, intent=f"q{i}"))
            for i in range(3)
        ]
    # Their messages were never published: the outbox sweeper sends them once Redis is back.
    for call in calls:
        settled(call, timeout=90)
    assert len(sandbox.ledger("payments")) == 3
    assert_invariants(sandbox, *calls)
