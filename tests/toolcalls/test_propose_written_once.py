"""A new call is written once, in the state its policy decided (toolcalls/sql_propose.py): the
same rows, the same events (types, producers, actors, payloads, causation), chained, as the
path that inserted it as proposed, then saved its transition and wrote its outbox row on its
own — for a call the policy authorizes and for one it holds for people."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from approvals.models import Approval
from runs.canonical import digest
from runs.events import verify_chain
from runs.models import Event, OutboxMessage, Run, Tenant
from runs.services import run_start
from tests.helpers import BIG_REFUND, REFUND
from tests.sandbox_process import Sandbox
from toolcalls import capabilities, gate, sql
from toolcalls.models import ToolCall
from toolcalls.propose import _proposed_payload, idempotency_key, tool_call_propose
from toolcalls.writes import tool_call_event

pytestmark = pytest.mark.django_db

# What differs between two calls of two runs by their nature: ids, keys, intents and times.
NAMED = ("id", "run_id", "intent", "idempotency_key", "external_request_id")
TIMES = ("created_at", "updated_at", "status_since")


def _step_by_step(tenant: Tenant, run_id: str, args: dict[str, Any], intent: str) -> ToolCall:
    """The proposal's writes as they were: INSERT as proposed, the proposed event, then the
    policy's transition saved by its own UPDATE and the outbox row by its own INSERT."""
    capability = capabilities.get("refund-order-v2")
    object_ref = capability.object_ref(args)
    with transaction.atomic():
        run = sql.lock_run(tenant_id=tenant.pk, run_id=run_id)
        run.tenant = tenant
        call = ToolCall(
            tenant=tenant,
            run=run,
            capability_id=capability.id,
            intent=intent,
            object_ref=object_ref,
            args=args,
            args_digest=digest(args),
            idempotency_key=idempotency_key(tenant, capability, object_ref, intent),
            external_request_id=f"req_{intent}",
        )
        sql.insert_call(call)
        payload = _proposed_payload(call, capability, [])
        tool_call_event(call, "tool_call.proposed", payload, actor="test", producer="api")
        needed = gate.requirement_for(call, capability)
        if needed.approvers:
            gate.tool_call_hold_for_approval(
                call=call,
                capability=capability,
                needed=needed,
                actor="test",
                producer="api",
                reason=f"policy v{needed.policy.version}: {needed.rule_name}",
                requested_by=None,
            )
        else:
            gate.tool_call_authorize(
                call=call,
                actor="test",
                producer="api",
                reason=f"policy v{needed.policy.version} asks no approver",
            )
    return call


def _row(obj: Any, *skip: str) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in skip
    }


def _events(run_id: str, call: ToolCall) -> list[dict[str, Any]]:
    """The run's events after its start, with the call's own names replaced by placeholders
    and each cause by the position of the event it names."""
    events = list(Event.objects.filter(run_id=run_id).order_by("seq"))
    assert verify_chain(events) == []
    positions = {event.id: n for n, event in enumerate(events)}
    names = {
        call.pk: "CALL",
        call.intent: "INTENT",
        call.idempotency_key: "KEY",
        call.external_request_id: "REQ",
        run_id: "RUN",
        events[0].correlation_id: "CORRELATION",
    }
    approvals = Approval.objects.filter(tool_call=call).values_list("pk", flat=True)
    names.update(dict.fromkeys(approvals, "APPROVAL"))

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            # A deadline is a time of its own in each run.
            return {key: "TIME" if key == "expires_at" else plain(v) for key, v in value.items()}
        if isinstance(value, list):
            return [plain(item) for item in value]
        if not isinstance(value, str):
            return value
        for name in sorted(names, key=len, reverse=True):  # also inside a reason's text
            value = value.replace(name, names[name])
        return value

    return [
        {
            **_row(event, "id", "run_id", "hash", "prev_hash", "recorded_at", "occurred_at"),
            "tool_call_id": plain(event.tool_call_id),
            "approval_id": plain(event.approval_id),
            "correlation_id": plain(event.correlation_id),
            "causation_id": positions.get(event.causation_id, event.causation_id),
            "payload": plain(event.payload),
        }
        for event in events[1:]
    ]


@pytest.mark.parametrize("args", [REFUND, BIG_REFUND], ids=["authorized", "held"])
def test_a_proposal_writes_what_the_step_by_step_path_wrote(
    tenant: Tenant, sandbox: Sandbox, args: dict[str, Any]
) -> None:
    before, _ = run_start(tenant=tenant, title="step by step", actor="test")
    now, _ = run_start(tenant=tenant, title="written once", actor="test")
    theirs = _step_by_step(tenant, before.pk, args, "the-same")
    ours, created = tool_call_propose(
        tenant=tenant,
        run_id=now.pk,
        capability_id="refund-order-v2",
        args=args,
        intent="the-same-again",
        actor="test",
    )

    assert created
    stored, expected = ToolCall.objects.get(pk=ours.pk), ToolCall.objects.get(pk=theirs.pk)
    assert _row(stored, *NAMED, *TIMES) == _row(expected, *NAMED, *TIMES)
    assert _row(stored) == _row(ours)  # the object is what was written
    assert ours.changed_fields() == ["updated_at"]  # and knows it, as after a save
    assert _events(now.pk, ours) == _events(before.pk, theirs)

    mine = list(Event.objects.filter(tool_call_id=ours.pk).order_by("seq"))
    assert stored.created_at <= mine[0].recorded_at  # written "before" its events
    assert stored.status_since == mine[1].occurred_at <= stored.updated_at
    messages = [
        _row(m, "id", "created_at", "available_at") | {"args": [m.args[0] == call.pk]}
        for call in (stored, expected)
        for m in OutboxMessage.objects.filter(args__0=call.pk)
    ]
    assert messages[: len(messages) // 2] == messages[len(messages) // 2 :]
    assert len(messages) == (2 if args is REFUND else 0)
    if args is BIG_REFUND:
        held = [Approval.objects.get(tool_call=call) for call in (stored, expected)]
        skip = ("id", "tool_call_id", "run_id", "created_at", "updated_at", "expires_at")
        assert _row(held[0], *skip) == _row(held[1], *skip)
        assert Run.objects.get(pk=now.pk).state == Run.objects.get(pk=before.pk).state
