"""Proposing calls straight through the service layer, for tests that drive dispatch."""

from __future__ import annotations

from runs.models import Run
from toolcalls import services
from toolcalls.models import ToolCall

REFUND = {"order_id": "order-002", "amount_cents": 2500, "currency": "USD"}


def propose(
    run: Run, capability: str = "refund-order-v2", args: dict = REFUND, intent: str = "intent-1"
) -> ToolCall:
    call, _ = services.tool_call_propose(
        tenant=run.tenant,
        run_id=run.pk,
        capability_id=capability,
        args=args,
        intent=intent,
        actor="test",
    )
    return call


def fresh(call: ToolCall) -> ToolCall:
    return ToolCall.objects.get(pk=call.pk)
