"""`manage.py soak` (bench/): a very short soak still runs everything and prints its table,
it refuses what it must not touch, and its detectors see the violations they count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from bench import pgstats, soak_faults, soak_report
from bench.procs import Child
from bench.soak_agents import fate
from runs.models import Event, OutboxMessage, Run
from tests.helpers import ROOT, WAYBILL, propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import Attempt, ToolCall

TABLE_ROWS = (
    "operations proposed",
    "operations lost",
    "duplicate external effects (sandbox ledger)",
    "stale results accepted",
    "approvals consumed twice",
    "time to quiescence after the last fault",
    "rebuild_projections --verify",
    "verify_event_chain",
    "secrets found in logs",
)


def server_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def soak(*args: str, database_url: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "manage.py", "soak", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.django_db
def test_a_short_soak_prints_its_table_and_exits_0() -> None:
    name = f"countersign_soak_test_{os.getpid()}"
    result = soak(
        "--minutes=0.5",
        "--workers=2",
        "--tenants=3",
        "--agents=1",
        "--pauses=2",
        "--redis-restarts=1",
        "--db-cuts=1",
        # The restart path runs, with a command that restarts nothing: the server is shared.
        "--pg-restart-cmd=true",
        f"--database={name}",
        "--drop-database",
        database_url=server_url(),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "== soak: every invariant held ==" in output
    for row in TABLE_ROWS:
        assert row in output, row
    assert pgstats.database_comment(server_url(), name) is None  # --drop-database


def test_it_refuses_sqlite() -> None:
    result = soak("--quick", database_url="sqlite:////tmp/x.sqlite3", timeout=60)
    assert result.returncode == 1
    assert "soak runs on PostgreSQL, not SQLite" in result.stderr


@pytest.mark.django_db
def test_it_leaves_a_database_it_did_not_create_alone() -> None:
    name = connection.settings_dict["NAME"]  # this test's own database
    result = soak("--quick", f"--database={name}", database_url=server_url(), timeout=60)
    assert result.returncode == 1
    assert f"A database {name} exists and soak did not create it" in result.stderr
    assert Run.objects.count() == 0  # and the database answers as before


def test_the_approvers_leave_and_reject_about_a_sixth_each() -> None:
    fates = [fate(f"apr_{n:05d}") for n in range(3000)]
    for what in ("leave", "reject"):
        assert 0.12 < fates.count(what) / len(fates) < 0.18, what


# --- the detectors --------------------------------------------------------------------------


def attempt(call, token: int, started: timedelta, ended: timedelta, classification: str):
    now = timezone.now()
    return Attempt.objects.create(
        tool_call=call,
        run=call.run,
        number=token,
        fencing_token=token,
        worker="test",
        started_at=now + started,
        ended_at=now + ended,
        classification=classification,
    )


@pytest.mark.django_db
def test_it_counts_a_result_recorded_after_a_later_claim_as_stale_accepted(
    run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)
    attempt(call, 1, timedelta(seconds=0), timedelta(seconds=30), "confirmed")
    attempt(call, 2, timedelta(seconds=10), timedelta(seconds=11), "confirmed")
    assert soak_report.fencing()["stale_accepted"] == 1


@pytest.mark.django_db
def test_a_late_result_refused_as_stale_is_not_counted(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    attempt(call, 1, timedelta(seconds=0), timedelta(seconds=30), "stale")
    attempt(call, 2, timedelta(seconds=10), timedelta(seconds=11), "confirmed")
    assert soak_report.fencing()["stale_accepted"] == 0


@pytest.mark.django_db
def test_it_counts_duplicate_and_orphan_effects_from_the_ledger(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run, WAYBILL, capability="create-waybill-v1")
    body = {"order_id": "order-002", "address_id": "addr-002"}
    for request_id in (call.external_request_id, call.external_request_id, "req_nobody"):
        # The carrier keeps no idempotency: each POST is an effect.
        assert sandbox.post("carrier", "/waybills", body, request_id=request_id).status_code == 201
    assert soak_report.effects(sandbox.url) == {"effects": 3, "duplicates": 1, "orphans": 1}


# Committed rows: the report's reads start with close_old_connections (the soak cuts its
# connections), which drops a connection left inside a transaction.
@pytest.mark.django_db(transaction=True)
def test_it_describes_each_lost_call_with_its_messages_and_events(
    run: Run, sandbox: Sandbox
) -> None:
    lost = propose_in(run)
    settled = propose_in(run, intent="intent-2")
    ToolCall.objects.filter(pk=settled.pk).update(execution_status="failed")
    assert soak_report.operations()["lost"] == 1
    lines = soak_report.lost_calls()
    assert lines[0].startswith(f"  {lost.pk} {lost.capability_id} {lost.execution_status}/")
    assert not any(settled.pk in line for line in lines)
    outbox_lines = [line for line in lines if line.startswith("    outbox ")]
    assert len(outbox_lines) == OutboxMessage.objects.filter(args__0=lost.pk).count() > 0
    events = [line.split()[3] for line in lines if line.startswith("    event ")]
    assert events == list(
        Event.objects.filter(tool_call_id=lost.pk)
        .order_by("seq")
        .values_list("event_type", flat=True)
    )


def test_a_workers_last_task_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "soak1.log"
    worker = Child("soak1", [], {}, tmp_path, log)
    assert soak_faults.last_task(worker) == "none"  # no log yet
    lines = [
        {
            "timestamp": "2026-12-03T00:41:25.411+00:00",
            "logger": "celery.app.trace",
            "message": "Task runs.drain_outbox[ff1d] succeeded in 0.08s: 2",
        },
        {
            "timestamp": "2026-12-03T00:41:26.002+00:00",
            "logger": "celery.app.trace",
            "message": "Task toolcalls.reconcile[51a2] raised unexpected: OperationalError()",
        },
        {
            "timestamp": "2026-12-03T00:41:27.000+00:00",
            "logger": "celery.worker.strategy",
            "message": "Task toolcalls.verify[77aa] received",
        },
        "not JSON: celery.app.trace ... succeeded in 1s",
    ]
    log.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines))
    assert soak_faults.last_task(worker) == "00:41:26.002 Task toolcalls.reconcile"
