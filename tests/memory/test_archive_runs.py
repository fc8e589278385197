"""`manage.py archive_runs`: finished runs' runtime rows move to the *_archive tables; the run
row and the event log stay, the chain goes on, and each tenant has its retention."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from approvals.models import Approval
from memory.models import Checkpoint, Feedback
from runs.credential_models import RunCredential
from runs.models import ApiKey, Decision, Event, Run, Tenant, User
from tests.helpers import BIG_REFUND, ApiClient, logged_in, propose, start_run
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch
from toolcalls.models import Attempt, Receipt, ToolCall

SMALL = {"order_id": "order-002", "amount_cents": 1000, "currency": "USD"}
LOST = {"order_id": "order-001", "amount_cents": 1500, "currency": "USD"}


def finished_run(agent: ApiClient, *, days_ago: float, title: str = "refunds") -> str:
    """A run with a decision, a verified refund, a refund held for approval (cancelled when
    the run stops), a checkpoint, feedback and a credential, stopped `days_ago` days ago."""
    run_id = start_run(agent, title, max_tool_calls=5)
    decision = agent.post(f"/api/v1/runs/{run_id}/decisions", {"kind": "k", "content": {}})
    small = propose(agent, SMALL, run_id=run_id, intent=f"{title}-small")
    run_due()
    propose(agent, BIG_REFUND, run_id=run_id, intent=f"{title}-big")
    agent.put(
        f"/api/v1/runs/{run_id}/checkpoints/main",
        {
            "schema_version": 1,
            "state": "s",
            "step_index": 1,
            "tool_call_ids": [small["tool_call_id"]],
            "decision_ids": [decision.json()["decision_id"]],
        },
    )
    agent.post(f"/api/v1/runs/{run_id}/feedback", {"rating": 5})
    agent.post(f"/api/v1/runs/{run_id}/credentials", {"ttl_s": 60})
    assert agent.post(f"/api/v1/runs/{run_id}/stop", {"reason": "done"}).status_code == 200
    Run.objects.filter(pk=run_id).update(ended_at=timezone.now() - timedelta(days=days_ago))
    return run_id


def hot_rows(run_id: str) -> dict[str, int]:
    return {
        "decisions": Decision.objects.filter(run_id=run_id).count(),
        "tool_calls": ToolCall.objects.filter(run_id=run_id).count(),
        "attempts": Attempt.objects.filter(run_id=run_id).count(),
        "receipts": Receipt.objects.filter(tool_call__run_id=run_id).count(),
        "approvals": Approval.objects.filter(run_id=run_id).count(),
        "checkpoints": Checkpoint.objects.filter(run_id=run_id).count(),
        "feedback": Feedback.objects.filter(run_id=run_id).count(),
        "credentials": RunCredential.objects.filter(run_id=run_id).count(),
    }


def archived_count(table: str, run_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}_archive WHERE run_id = %s", [run_id])
        return cursor.fetchone()[0]


def test_dry_run_prints_what_would_move_and_moves_nothing(
    agent: ApiClient, sandbox: Sandbox, capsys: pytest.CaptureFixture[str]
) -> None:
    old = finished_run(agent, days_ago=40)
    before, events_before = hot_rows(old), Event.objects.count()
    call_command("archive_runs", "--older-than", "30d", "--dry-run")
    out = capsys.readouterr().out
    assert f"would move {old} (acme, cancelled): " in out
    assert "toolcalls_toolcall 2" in out and "memory_checkpoint 1" in out
    assert "would archive 1 runs" in out
    assert hot_rows(old) == before
    assert Event.objects.count() == events_before
    assert Run.objects.get(pk=old).archived_at is None


def test_it_moves_the_rows_and_keeps_the_run_and_its_chain(
    agent: ApiClient,
    sandbox: Sandbox,
    settings: Any,
    capsys: pytest.CaptureFixture[str],
    admin_user: User,
) -> None:
    settings.EVAL_TRACE_SETTLE_SECONDS = 0
    old = finished_run(agent, days_ago=40, title="old")
    recent = finished_run(agent, days_ago=3, title="recent")
    still_open = start_run(agent, "open")
    Run.objects.filter(pk=still_open).update(updated_at=timezone.now() - timedelta(days=90))
    before = hot_rows(old)
    assert all(before.values()), before
    events_of_old = Event.objects.filter(run_id=old).count()

    call_command("archive_runs", "--older-than", "30d")
    assert f"moved {old} (acme, cancelled)" in capsys.readouterr().out

    assert set(hot_rows(old).values()) == {0}
    assert archived_count("toolcalls_toolcall", old) == before["tool_calls"]
    assert archived_count("memory_checkpoint", old) == before["checkpoints"]
    assert archived_count("approvals_approval", old) == before["approvals"]
    assert all(hot_rows(recent).values())
    run = Run.objects.get(pk=old)
    assert run.archived_at is not None
    assert Run.objects.get(pk=recent).archived_at is None
    assert Run.objects.get(pk=still_open).archived_at is None
    # The log keeps every event and goes on with one more.
    last = Event.objects.filter(run_id=old).order_by("-seq").first()
    assert (Event.objects.filter(run_id=old).count(), last.event_type) == (
        events_of_old + 1,
        "run.archived",
    )
    assert last.payload["moved"]["toolcalls_toolcall"] == before["tool_calls"]
    call_command("verify_event_chain")
    call_command("rebuild_projections", "--verify")
    assert "1 archived runs were left out" in capsys.readouterr().out
    # The run is still read; what came from the moved rows says where they went.
    assert agent.get(f"/api/v1/runs/{old}").json()["state"] == "cancelled"
    resume = agent.get(f"/api/v1/runs/{old}/resume")
    assert (resume.status_code, resume.json()["error"]["name"]) == (409, "run.archived")
    checkpoint = agent.get(f"/api/v1/runs/{old}/checkpoints/main")
    assert checkpoint.json()["error"]["name"] == "run.archived"
    # The eval trace is folded from the log: it is still served.
    ApiKey.objects.update(scopes=["*", "eval:read"])
    text = b"".join(agent.get("/api/v1/eval-traces").streaming_content).decode()
    assert old in [json.loads(line)["run_id"] for line in text.splitlines()]
    # The run page reads the log for its timeline: an archived run still shows.
    page = logged_in(admin_user).get(f"/runs/{old}/")
    assert page.status_code == 200 and old in page.content.decode()
    # Nothing is archived twice.
    call_command("archive_runs", "--older-than", "30d")
    assert "archived 0 runs" in capsys.readouterr().out


def test_a_tampered_event_of_an_archived_run_is_still_found(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    old = finished_run(agent, days_ago=40)
    call_command("archive_runs", "--older-than", "30d")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
        cursor.execute(
            'UPDATE runs_event SET payload = \'{"title": "forged"}\' WHERE run_id = %s AND seq = 1',
            [old],
        )
    with pytest.raises(CommandError, match="problems"):
        call_command("verify_event_chain")


def test_without_older_than_each_tenant_keeps_its_own_retention(
    agent: ApiClient,
    other_agent: ApiClient,
    tenant: Tenant,
    other_tenant: Tenant,
    sandbox: Sandbox,
) -> None:
    forty, ten = (
        finished_run(agent, days_ago=40, title="a"),
        finished_run(agent, days_ago=10, title="b"),
    )
    other_tenant.archive_after_days = None  # keeps everything in the hot tables
    other_tenant.save()
    theirs = start_run(other_agent, "theirs")
    other_agent.post(f"/api/v1/runs/{theirs}/complete")
    Run.objects.filter(pk=theirs).update(ended_at=timezone.now() - timedelta(days=400))
    assert tenant.archive_after_days == 30  # the default

    call_command("archive_runs")
    archived = set(Run.objects.filter(archived_at__isnull=False).values_list("pk", flat=True))
    assert archived == {forty}

    tenant.archive_after_days = 7
    tenant.save()
    call_command("archive_runs")
    archived = set(Run.objects.filter(archived_at__isnull=False).values_list("pk", flat=True))
    assert archived == {forty, ten}


def test_a_run_whose_call_is_still_unknown_is_not_archived(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    run_id = start_run(agent)
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    lost = propose(agent, LOST, run_id=run_id, intent="lost")
    dispatch.tool_call_dispatch(tool_call_id=lost["tool_call_id"])
    agent.post(f"/api/v1/runs/{run_id}/stop", {"reason": "enough"})
    assert Run.objects.get(pk=run_id).state == "cancelled"
    Run.objects.filter(pk=run_id).update(ended_at=timezone.now() - timedelta(days=90))
    call_command("archive_runs", "--older-than", "1d")
    assert Run.objects.get(pk=run_id).archived_at is None
    assert ToolCall.objects.filter(run_id=run_id).count() == 1


def test_an_archive_table_that_drifted_from_its_hot_table_is_refused(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    old = finished_run(agent, days_ago=40)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE runs_decision_archive (id varchar(40), run_id varchar(40))")
    with pytest.raises(CommandError, match="runs_decision_archive has columns"):
        call_command("archive_runs", "--older-than", "30d")
    assert Run.objects.get(pk=old).archived_at is None
    assert Decision.objects.filter(run_id=old).count() == 1
