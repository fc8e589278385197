"""Reading a call (and waiting for it), retry, reconcile, and where credentials must not go."""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.db import connections

from runs.models import Event, OutboxMessage, User
from tests.helpers import (
    BIG_REFUND,
    WAYBILL,
    ApiClient,
    consistency_window,
    logged_in,
    propose,
    start_run,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch
from toolcalls.connectors import SANDBOX_TOKENS, endpoint_for
from toolcalls.models import ToolCall


@pytest.mark.django_db(transaction=True)
def test_wait_returns_as_soon_as_the_call_changes(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent)

    def dispatch_soon() -> None:
        time.sleep(0.5)
        dispatch.tool_call_dispatch(tool_call_id=call["tool_call_id"])
        connections.close_all()

    threading.Thread(target=dispatch_soon).start()
    started = time.monotonic()
    response = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}?wait=20")
    elapsed = time.monotonic() - started
    # The first change it sees: the claim's commit (dispatching) or, if the send was quick,
    # the outcome's.
    assert response.json()["execution_status"] in ("dispatching", "completed")
    assert elapsed < 15  # it answered when the call changed, not at the end of the wait


@pytest.mark.django_db(transaction=True)
def test_wait_since_the_updated_at_it_answered_waits_for_a_change(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    """`since` is the `updated_at` of an answer, which the API writes to the millisecond: the
    same call, unchanged, is not news."""
    call = propose(agent, BIG_REFUND)
    seen = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}").json()["updated_at"]

    def cancel_soon() -> None:
        time.sleep(0.5)
        agent.post(f"/api/v1/tool-calls/{call['tool_call_id']}/cancel")
        connections.close_all()

    threading.Thread(target=cancel_soon).start()
    response = agent.get(
        f"/api/v1/tool-calls/{call['tool_call_id']}?wait=20&since={quote(seen)}"
    ).json()
    assert response["status"] == "cancelled"  # the change it waited for, not the old state


def test_wait_is_bounded(agent: ApiClient, sandbox: Sandbox) -> None:
    call = propose(agent)
    response = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}?wait=31")
    assert response.status_code == 422


def test_an_unknown_outcome_is_reconciled_not_retried(agent: ApiClient, sandbox: Sandbox) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call_id = propose(agent)["tool_call_id"]
    dispatch.tool_call_dispatch(tool_call_id=call_id)
    retry = agent.post(f"/api/v1/tool-calls/{call_id}/retry")
    assert retry.status_code == 409
    assert retry.json()["error"]["name"] == "tool_call.outcome_unknown"
    reconcile = agent.post(f"/api/v1/tool-calls/{call_id}/reconcile")
    assert reconcile.status_code == 202
    assert OutboxMessage.objects.filter(task="toolcalls.reconcile", args=[call_id]).count() == 2


def test_a_settled_call_is_neither_retried_nor_reconciled(agent: ApiClient, sandbox: Sandbox):
    call_id = propose(agent)["tool_call_id"]
    run_due()
    for command, name in (
        ("retry", "tool_call.not_retryable"),
        ("reconcile", "tool_call.not_unknown"),
    ):
        response = agent.post(f"/api/v1/tool-calls/{call_id}/{command}")
        assert response.status_code == 409
        assert response.json()["error"]["name"] == name


def test_a_call_that_failed_without_executing_is_retried(agent: ApiClient, sandbox, monkeypatch):
    monkeypatch.setattr(dispatch, "backoff", lambda policy, failures, retry_after: 0.0)
    sandbox.faults(system="payments", http_429=1.0, retry_after=0, times=6)
    call_id = propose(agent)["tool_call_id"]
    run_due()
    assert ToolCall.objects.get(pk=call_id).execution_status == "failed"
    response = agent.post(f"/api/v1/tool-calls/{call_id}/retry")
    assert response.status_code == 202
    assert response.json()["execution_status"] == "authorized"
    run_due()
    body = agent.get(f"/api/v1/tool-calls/{call_id}").json()
    assert (body["execution_status"], body["verification_status"]) == (
        "completed",
        "confirmed_success",
    )
    assert body["attempts"] == 7
    assert len(sandbox.effects_for(body["external_request_id"])) == 1


def test_compensation_twice_has_one_effect(agent: ApiClient, sandbox: Sandbox) -> None:
    reserve_id = propose(
        agent,
        {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1, "order_id": "order-002"},
        capability="reserve-stock-v1",
    )["tool_call_id"]
    run_due()
    assert ToolCall.objects.get(pk=reserve_id).verification_status == "confirmed_success"
    first = agent.post(f"/api/v1/tool-calls/{reserve_id}/compensate")
    second = agent.post(f"/api/v1/tool-calls/{reserve_id}/compensate")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["tool_call_id"] == second.json()["tool_call_id"]
    run_due()
    release = ToolCall.objects.get(pk=first.json()["tool_call_id"])
    assert release.verification_status == "confirmed_success"
    assert ToolCall.objects.get(pk=reserve_id).execution_status == "compensated"
    operations = [e["operation"] for e in sandbox.ledger("warehouse")]
    assert operations == ["reservation.create", "reservation.release"]
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def test_expired_credentials_fail_the_call_without_an_effect(
    agent: ApiClient, sandbox: Sandbox, settings
) -> None:
    call_id = propose(agent)["tool_call_id"]
    settings.COUNTERSIGN_CONNECTORS = {
        "acme": {"payments": {"base_url": f"{sandbox.url}/payments", "token": "expired-key"}}
    }
    run_due()
    call = ToolCall.objects.get(pk=call_id)
    assert (call.execution_status, call.last_error_name) == ("failed", "tool.auth_failed")
    assert sandbox.ledger() == []


def test_configured_connectors_override_the_sandbox(settings) -> None:
    settings.COUNTERSIGN_CONNECTORS = {
        "acme": {"carrier": {"base_url": "https://carrier.example/api/", "token": "live-key"}}
    }
    configured = endpoint_for("acme", "carrier")
    assert (configured.base_url, configured.token) == ("https://carrier.example/api", "live-key")
    assert "live-key" not in repr(configured)
    assert endpoint_for("globex", "carrier").token == SANDBOX_TOKENS["carrier"]


def test_credentials_appear_nowhere_a_run_leaves_traces(
    agent: ApiClient, approver: User, sandbox: Sandbox, caplog, monkeypatch
) -> None:
    caplog.set_level(logging.DEBUG)
    consistency_window(monkeypatch, "refund-order-v2", 0)  # look it up without waiting
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call = propose(agent)
    run_due()  # sent, its answer lost, looked up and found
    reserve_run = start_run(agent, "ship")
    propose(agent, WAYBILL, capability="create-waybill-v1", intent="ship-1", run_id=reserve_run)
    run_due()
    browser = logged_in(approver)
    traces = [
        caplog.text,
        agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}").content.decode(),
        agent.get("/api/v1/capabilities").content.decode(),
        browser.get(f"/runs/{call['run_id']}/").content.decode(),
        browser.get(f"/runs/{reserve_run}/").content.decode(),
        *(str(e.payload) for e in Event.objects.all()),
    ]
    assert Event.objects.filter(event_type="tool_call.accepted").count() == 2
    for secret in SANDBOX_TOKENS.values():
        assert all(secret not in trace for trace in traces), secret
