"""Business invariants under injected faults, with real Celery worker and beat processes on
PostgreSQL and Redis and the sandbox over HTTP (DESIGN section 12).

Each test asserts the sandbox's ledger (at most one effect per logical operation), the final
states, and that the state replayed from the log equals the stored state.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from config.celery_app import app
from runs.models import Tenant
from runs.services import api_key_issue
from tests.celery_processes import CeleryProcess, flush_broker, process_env
from tests.conftest import ApiClient
from tests.helpers import redis_down, wait_for
from tests.sandbox_process import Sandbox
from toolcalls.connectors import SANDBOX_TOKENS
from toolcalls.models import Attempt, ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REFUND = {"order_id": "order-002", "amount_cents": 2500, "currency": "USD"}


@pytest.fixture
def api() -> ApiClient:
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    return ApiClient(api_key_issue(tenant=tenant, name="agent")[1])


@pytest.fixture
def start(sandbox: Sandbox, tmp_path: Path) -> Callable[..., CeleryProcess]:
    flush_broker()
    started: list[CeleryProcess] = []

    def start_process(kind: str = "worker", **env: str) -> CeleryProcess:
        name = f"{kind}{len(started)}"
        process = CeleryProcess(kind, name, process_env(sandbox.url, **env), tmp_path)
        started.append(process.start())
        return process

    yield start_process
    for process in started:
        process.stop()


def propose(
    api: ApiClient,
    capability: str = "refund-order-v2",
    args: dict = REFUND,
    intent: str = "intent-1",
) -> ToolCall:
    run_id = api.post("/api/v1/runs", {"title": "fault test"}).json()["run_id"]
    response = api.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"capability": capability, "args": args, "intent": intent},
    )
    assert response.status_code == 201, response.json()
    return ToolCall.objects.get(pk=response.json()["tool_call_id"])


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


def test_a_call_runs_through_worker_processes(api, sandbox, start) -> None:
    worker = start("worker")
    call = settled(propose(api))
    assert call.execution_status == "completed"
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)
    # The worker injected the credentials and logged none of them.
    assert "toolcalls.verify" in worker.output()
    assert not any(token in worker.output() for token in SANDBOX_TOKENS.values())


def test_a_worker_killed_before_sending(api, sandbox, start, tmp_path) -> None:
    start("worker", **crash_at("before_send", tmp_path))
    start("beat")
    call = settled(propose(api))
    assert (tmp_path / "before_send.crashed").exists()
    assert [a.error_name for a in call.attempts.order_by("number")] == ["tool.lease_expired", ""]
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_a_worker_killed_after_the_system_committed(api, sandbox, start, tmp_path) -> None:
    start("worker", **crash_at("after_send", tmp_path))
    start("beat")
    call = settled(propose(api))
    assert (tmp_path / "after_send.crashed").exists()
    # The lease expired, and the look-up found what the dead worker had done: no resend.
    assert call.attempts.count() == 1
    assert call.receipts.get().source == "lookup"
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_a_worker_killed_after_the_outcome_commit_before_the_ack(
    api, sandbox, start, tmp_path
) -> None:
    worker = start("worker", **crash_at("before_ack", tmp_path))
    call = settled(propose(api))
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


def test_the_same_message_to_two_workers_at_once(api, sandbox, start) -> None:
    start("worker")
    start("worker")
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=0.5)
    call = propose(api)
    for _ in range(3):  # duplicate deliveries racing the outbox's own message
        app.send_task("toolcalls.dispatch", args=[call.pk])
    call = settled(call)
    assert call.attempts.count() == 1
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_a_worker_paused_past_its_lease_comes_back_stale(api, sandbox, start) -> None:
    paused = start("worker", TOOLCALL_TIMEOUT_OVERRIDE="4")
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=3, times=1)
    call = propose(api)
    wait_for(
        lambda: ToolCall.objects.get(pk=call.pk).execution_status == "dispatching", 10, "the claim"
    )
    paused.signal_pool(signal.SIGSTOP)
    start("worker")
    start("beat")
    call = settled(call)  # lease expired; the look-up found the refund
    paused.signal_pool(signal.SIGCONT)
    wait_for(
        lambda: call.run.events.filter(event_type="tool_call.stale_result_refused").exists(),
        20,
        "the paused worker's late result to be refused",
    )
    assert Attempt.objects.get(tool_call=call, number=1).classification == "stale"
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert_invariants(sandbox, call)


def test_a_dropped_carrier_response_with_look_up_lag(api, sandbox, start) -> None:
    start("worker")
    sandbox.faults(system="carrier", drop_response_after_commit=1.0, times=1, lookup_lag_seconds=2)
    call = settled(
        propose(api, "create-waybill-v1", {"order_id": "order-002", "address_id": "addr-002"})
    )
    assert len(sandbox.ledger("carrier")) == 1
    assert_invariants(sandbox, call)


def test_rate_limited_then_success(api, sandbox, start) -> None:
    start("worker")
    sandbox.faults(system="payments", http_429=1.0, retry_after=1, times=2)
    call = settled(propose(api))
    assert [a.error_name for a in call.attempts.order_by("number")] == [
        "tool.rate_limited",
        "tool.rate_limited",
        "",
    ]
    assert_invariants(sandbox, call)


def test_a_5xx_storm_opens_the_circuit(api, sandbox, start) -> None:
    start("worker")
    sandbox.faults(system="payments", http_5xx=1.0)
    calls = [
        propose(api, args={**REFUND, "amount_cents": 100 + i}, intent=f"i{i}") for i in range(4)
    ]
    wait_for(
        lambda: ToolCall.objects.filter(run__events__event_type="tool_call.deferred").exists(),
        40,
        "the open circuit to defer a call",
    )
    sent_while_open = Attempt.objects.count()
    sandbox.clear_faults()
    for call in calls:
        settled(call, timeout=60)
    assert sent_while_open < 4 * 5  # the breaker stopped them before their retry budgets
    assert len(sandbox.ledger("payments")) == 4
    assert_invariants(sandbox, *calls)


def test_compensation_twice_has_one_effect(api, sandbox, start) -> None:
    start("worker")
    reserve = settled(
        propose(
            api,
            "reserve-stock-v1",
            {
                "warehouse_id": "wh-acme-1",
                "sku": "PART-100",
                "quantity": 1,
                "order_id": "order-002",
            },
        )
    )
    first = api.post(f"/api/v1/tool-calls/{reserve.pk}/compensate")
    second = api.post(f"/api/v1/tool-calls/{reserve.pk}/compensate")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["tool_call_id"] == second.json()["tool_call_id"]
    release = settled(ToolCall.objects.get(pk=first.json()["tool_call_id"]))
    assert ToolCall.objects.get(pk=reserve.pk).execution_status == "compensated"
    operations = [e["operation"] for e in sandbox.ledger("warehouse")]
    assert operations == ["reservation.create", "reservation.release"]
    assert_invariants(sandbox, reserve, release)


def test_the_sandbox_restarted_mid_run(api, sandbox, start) -> None:
    start("worker")
    start("beat")
    # Slow answers keep calls in flight when the sandbox goes down under them.
    sandbox.faults(system="payments", delay_response=1.0, delay_seconds=0.5)
    calls = [
        propose(api, args={**REFUND, "amount_cents": 200 + i}, intent=f"r{i}") for i in range(3)
    ]
    sandbox.stop()
    time.sleep(2)  # the rest meet a closed port: retryable, nothing executed
    sandbox.start()  # with its state from disk, and no faults
    for call in calls:
        settled(call, timeout=60)
    assert len(sandbox.ledger("payments")) == 3
    assert_invariants(sandbox, *calls)


def test_redis_restarted_mid_run(api, sandbox, start) -> None:
    start("worker")
    start("beat")
    with redis_down(settings.CELERY_BROKER_URL):
        calls = [
            propose(api, args={**REFUND, "amount_cents": 300 + i}, intent=f"q{i}") for i in range(3)
        ]
    # Their messages were never published: the outbox sweeper sends them once Redis is back.
    for call in calls:
        settled(call, timeout=90)
    assert len(sandbox.ledger("payments")) == 3
    assert_invariants(sandbox, *calls)
