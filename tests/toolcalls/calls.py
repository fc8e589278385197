"""Proposing calls straight through the service layer, for tests that drive dispatch."""

from __future__ import annotations

from typing import Any

from runs.models import Run
from toolcalls import dispatch
from toolcalls.models import ToolCall
from toolcalls.propose import tool_call_propose

REFUND = {"order_id": "order-002", "amount_cents": 2500, "currency": "USD"}


def propose(
    run: Run, capability: str = "refund-order-v2", args: dict = REFUND, intent: str = "intent-1"
) -> ToolCall:
    call, _ = tool_call_propose(
        tenant=run.tenant,
        run_id=run.pk,
        capability_id=capability,
        args=args,
        intent=intent,
        actor="test",
    )
    return call


def open_the_circuit(run: Run, sandbox: Any, settings: Any, monkeypatch: Any) -> list[ToolCall]:
    """Four refunds meet a 5xx storm, sent three times each without backoff: the circuit of
    refund-order-v2 opens (for one second)."""
    settings.CIRCUIT_OPEN_SECONDS = 1.0
    monkeypatch.setattr(dispatch, "backoff", lambda policy, failures, retry_after: 0.0)
    sandbox.faults(system="payments", http_5xx=1.0)
    calls = [
        propose(run, args={**REFUND, "amount_cents": 100 + i}, intent=f"i-{i}") for i in range(4)
    ]
    for _ in range(3):
        for call in calls:
            dispatch.tool_call_dispatch(tool_call_id=call.pk)
    return calls


def fresh(call: ToolCall) -> ToolCall:
    return ToolCall.objects.get(pk=call.pk)
