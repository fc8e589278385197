"""The proposal's tally and the claim's readiness read count a run's calls and attempts in a
statement prepared once per connection (psycopg's server-side binding). PostgreSQL keeps
planning a prepared statement anew while each custom plan looks cheaper than the generic one:
with the run's id visible to the planner, a small run beside one of hundreds made it plan on
every proposal and every claim (pg_stat_statements: `plans` = `calls`, 0.3-0.4 ms each). With the
id hidden in a sub-select, both plans estimate the average run and the generic one is kept.

The data: one run of 400 calls with 400 attempts and a run of one, analyzed (rows cloned from
a real call and attempt, so that the statistics see two runs of such different sizes)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.utils import timezone
from psycopg.sql import Literal

from runs.models import Run
from runs.services import run_start
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls import sql, sql_propose
from toolcalls.models import Attempt, ToolCall

BIG = 400


def _clone(model: type, source_id: str, copies: int, unique: dict[str, str]) -> None:
    """`copies` rows like `source_id`'s: `id` suffixed with the copy's number `g`, each column
    in `unique` given by its expression of `g`."""
    unique = {"id": "id || '-' || g", **unique}
    columns = [f.column for f in model._meta.concrete_fields]
    values = [unique.get(c, c) for c in columns]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {model._meta.db_table} ({', '.join(columns)})"
            f" SELECT {', '.join(values)} FROM {model._meta.db_table},"
            f" generate_series(1, %s) AS g WHERE id = %s",
            [copies, source_id],
        )


def _generic_plans(statement: str, params: list) -> int:
    """How many of 10 executions of `statement`, prepared, ran the generic plan."""
    numbered = iter(range(1, 100))
    prepared = re.sub(r"%s", lambda _: f"${next(numbered)}", statement)
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE probe AS {prepared}")
        try:
            # Literals: EXECUTE takes no bound parameters (server-side binding would send some).
            values = ", ".join(Literal(v).as_string(connection.connection) for v in params)
            for _ in range(10):
                cursor.execute(f"EXECUTE probe({values})")
            cursor.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'probe'")
            return cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE probe")


@pytest.fixture
def small_run(run: Run, sandbox: Sandbox) -> Run:
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL (DATABASE_URL=postgres://…)")
    call = propose_in(run, {"order_id": "order-001", "amount_cents": 100, "currency": "USD"})
    attempt = Attempt.objects.create(
        id="att_probe",
        tool_call=call,
        run=run,
        number=1,
        fencing_token=1,
        worker="probe",
        started_at=timezone.now(),
    )
    suffixed = {c: f"{c} || '-' || g" for c in ("idempotency_key", "external_request_id")}
    _clone(ToolCall, call.pk, BIG, suffixed)
    _clone(Attempt, attempt.pk, BIG, {"number": "number + g"})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE toolcalls_toolcall")
        cursor.execute("ANALYZE toolcalls_attempt")
    small, _ = run_start(tenant=run.tenant, title="small", actor="test")
    propose_in(small, {"order_id": "order-002", "amount_cents": 100, "currency": "USD"})
    return small


def test_the_proposals_tally_keeps_its_generic_plan(small_run: Run) -> None:
    params = [small_run.pk, small_run.tenant_id, "refund-order-v2", small_run.pk]
    assert _generic_plans(sql_propose._TALLY, params) > 0
    assert (
        sql_propose.run_tally(
            run_id=small_run.pk, tenant_id=small_run.tenant_id, capability_id="refund-order-v2"
        ).calls
        == 1
    )


def test_the_claims_readiness_keeps_its_generic_plan(small_run: Run) -> None:
    call = ToolCall.objects.get(run=small_run)
    target = [small_run.tenant_id, call.capability_id]
    params = [small_run.pk, call.pk, *target, *target]
    assert _generic_plans(sql._READINESS, params) > 0
    big_call = ToolCall.objects.filter(run__title="refund").first()
    assert sql.readiness(big_call).attempts_in_run == BIG + 1
