"""`manage.py soak` (bench/): a very short soak still runs everything and prints its table,
it refuses what it must not touch, and its detectors see the violations they count."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from bench import pgstats, soak_report
from bench.soak_agents import fate
from runs.models import Run
from tests.helpers import ROOT, WAYBILL, propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import Attempt

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
