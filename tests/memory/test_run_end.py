"""What a run's end cleans up: pending approvals close (cancelled, with the reason), its
checkpoints are archived and stay readable, its credentials are revoked — each a recorded
fact in the transaction of the run's end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import Approval
from memory.models import Checkpoint
from runs.models import ApiKey, Event, Run
from runs.services import run_transition
from tests.helpers import BIG_REFUND, ApiClient, approval_of, propose, start_run
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

BODY = {"schema_version": 1, "state": "refunding", "step_index": 2, "data": {"note": "n"}}


def put(agent: ApiClient, run_id: str, name: str = "main", **fields: Any) -> dict[str, Any]:
    response = agent.put(f"/api/v1/runs/{run_id}/checkpoints/{name}", {**BODY, **fields})
    assert response.status_code in (200, 201), response.json()
    return response.json()


def types_after(run_id: str, event_type: str) -> list[str]:
    events = list(Event.objects.filter(run_id=run_id).order_by("seq"))
    start = next(i for i, e in enumerate(events) if e.event_type == event_type)
    return [e.event_type for e in events[start:]]


def test_completing_archives_the_checkpoints_which_stay_readable(
    agent: ApiClient, settings: Any
) -> None:
    settings.EVAL_TRACE_SETTLE_SECONDS = 0
    ApiKey.objects.update(scopes=["*", "eval:read"])
    run_id = start_run(agent)
    first = put(agent, run_id)
    second = put(agent, run_id, step_index=3)
    planner = put(agent, run_id, "planner")
    assert first["archived_at"] is None

    assert agent.post(f"/api/v1/runs/{run_id}/complete").json()["state"] == "completed"

    assert types_after(run_id, "run.completed") == ["run.completed", "checkpoints.archived"]
    archived = Event.objects.get(run_id=run_id, event_type="checkpoints.archived")
    assert archived.payload["checkpoint_ids"] == [
        first["checkpoint_id"],
        second["checkpoint_id"],
        planner["checkpoint_id"],
    ]
    assert "completed" in archived.payload["reason"]
    assert not Checkpoint.objects.filter(run_id=run_id, archived_at__isnull=True).exists()
    # Read-only, and still served: to the reader, to resume and to the eval trace.
    latest = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main").json()
    assert (latest["checkpoint_id"], latest["step_index"]) == (second["checkpoint_id"], 3)
    assert latest["archived_at"] is not None
    assert put_status(agent, run_id) == 409
    resumed = agent.get(f"/api/v1/runs/{run_id}/resume").json()
    assert sorted(c["checkpoint_id"] for c in resumed["checkpoints"]) == sorted(
        [second["checkpoint_id"], planner["checkpoint_id"]]
    )
    traces = agent.get("/api/v1/eval-traces")
    lines = b"".join(traces.streaming_content).decode().splitlines()
    [trace] = [json.loads(line) for line in lines if line]
    assert trace["run_id"] == run_id
    assert second["checkpoint_id"] in json.dumps(trace)
    call_command("rebuild_projections", "--verify")
    call_command("verify_event_chain")


def put_status(agent: ApiClient, run_id: str) -> int:
    return agent.put(
        f"/api/v1/runs/{run_id}/checkpoints/main", {**BODY, "step_index": 9}
    ).status_code


def test_a_run_with_nothing_to_clean_writes_no_cleanup_event(agent: ApiClient) -> None:
    run_id = start_run(agent)
    agent.post(f"/api/v1/runs/{run_id}/complete")
    assert types_after(run_id, "run.completed") == ["run.completed"]


def test_stopping_cancels_the_pending_approval_with_the_reason(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    call = propose(agent, BIG_REFUND, run_id=run_id)
    approval = approval_of(call)
    assert approval.state == Approval.State.PENDING
    agent.post(f"/api/v1/runs/{run_id}/stop", {"reason": "customer withdrew"})
    approval.refresh_from_db()
    assert approval.state == Approval.State.CANCELLED
    cancelled = Event.objects.get(approval_id=approval.pk, event_type="approval.cancelled")
    assert cancelled.payload["reason"] == "customer withdrew"


def test_any_terminal_transition_closes_what_is_still_open(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    """The cleanup does not depend on the caller: a run cancelled by any path (here the
    transition itself, without run_stop) leaves no approval pending and no call to send."""
    run_id = start_run(agent)
    call = propose(agent, BIG_REFUND, run_id=run_id)
    put(agent, run_id)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        run_transition(run, "cancel", actor="system:test", producer="test", reason="gone")
    approval = approval_of(call)
    assert approval.state == Approval.State.CANCELLED
    assert ToolCall.objects.get(pk=call["tool_call_id"]).execution_status == "cancelled"
    reason = Event.objects.get(approval_id=approval.pk, event_type="approval.cancelled")
    assert reason.payload["reason"] == f"run {run_id} ended: cancelled"
    assert types_after(run_id, "run.cancelled")[-1] == "checkpoints.archived"
    assert Run.objects.get(pk=run_id).ended_at is not None
    call_command("rebuild_projections", "--verify")


def test_needs_human_is_not_an_end(agent: ApiClient) -> None:
    """A person may resume a run handed to them, so nothing is closed or archived yet."""
    run_id = start_run(agent)
    put(agent, run_id)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        run_transition(run, "hand_to_human", actor="system:test", producer="test")
    assert Checkpoint.objects.get(run_id=run_id).archived_at is None
    assert Run.objects.get(pk=run_id).ended_at is None


def test_the_database_lets_archiving_change_nothing_else(agent: ApiClient) -> None:
    run_id = start_run(agent)
    checkpoint_id = put(agent, run_id)["checkpoint_id"]
    rows = Checkpoint.objects.filter(pk=checkpoint_id)
    with pytest.raises(IntegrityError, match="only archiving"), transaction.atomic():
        rows.update(archived_at=timezone.now(), body={"state": "rewritten"})
    rows.update(archived_at=timezone.now())
    with pytest.raises(IntegrityError, match="only archiving"), transaction.atomic():
        rows.update(archived_at=None)
    with pytest.raises(IntegrityError, match="only archiving"), transaction.atomic():
        rows.update(archived_at=timezone.now())
    assert rows.get().body["state"] == BODY["state"]
