"""The proposal's tally and the claim's readiness read count a run's calls and attempts in a
statement prepared once per connection (psycopg's server-side binding). PostgreSQL keeps
planning a prepared statement anew while each custom plan looks cheaper than the generic one:
with the run's id visible to the planner, a run whose estimate was below the average run's made
it plan on every proposal and every claim (pg_stat_statements: `plans` = `calls`, 0.3-0.4 ms
each). With the id hidden in a sub-select, both plans estimate the average run and the generic
one is kept.

The skew is made on temporary copies of the two tables (same columns and indexes), which shadow
the shared ones on this connection: ANALYZE writes a table's row and page counts in place, past
the test's rollback, and the shared tables' counts are what later tests' plans are made from
(tests/test_page_plans.py). In the copies: the run's one call and attempt cloned 5,000 times, and
a second run of one call; analyzed, so the statistics know the big run."""

from __future__ import annotations

import re
from collections.abc import Iterator

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

BIG = 5000
TABLES = (ToolCall._meta.db_table, Attempt._meta.db_table)


def _clone(model: type, source_id: str, copies: int, unique: dict[str, str]) -> None:
    """`copies` rows like `source_id`'s in the temporary copy: `id` suffixed with the copy's
    number `g`, each column in `unique` given by its expression of `g`."""
    unique = {"id": "id || '-' || g", **unique}
    columns = [f.column for f in model._meta.concrete_fields]
    values = [unique.get(c, c) for c in columns]
    table = f"pg_temp.{model._meta.db_table}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)})"
            f" SELECT {', '.join(values)} FROM {table}, generate_series(1, %s) AS g WHERE id = %s",
            [copies, source_id],
        )


def _generic_plans(statement: str, params: list) -> int:
    """How many of 10 executions of `statement`, prepared, ran the generic plan."""
    numbered = iter(range(1, 100))
    prepared = re.sub(r"%s", lambda _: f"${next(numbered)}", statement)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = auto")  # the server's default, named
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


def _unprepared(statement: str, params: list) -> tuple:
    return connection.connection.execute(statement, params, prepare=False).fetchone()


@pytest.fixture
def runs(run: Run, sandbox: Sandbox) -> Iterator[tuple[Run, Run]]:
    """(the big run, the small run), their rows in the analyzed temporary copies."""
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL (DATABASE_URL=postgres://…)")
    call = propose_in(run)
    attempt = Attempt.objects.create(
        id="att_probe",
        tool_call=call,
        run=run,
        number=1,
        fencing_token=1,
        worker="probe",
        started_at=timezone.now(),
    )
    small, _ = run_start(tenant=run.tenant, title="small", actor="test")
    propose_in(small, {"order_id": "order-001", "amount_cents": 100, "currency": "USD"})
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"CREATE TEMPORARY TABLE {table} (LIKE public.{table} INCLUDING ALL)")
            cursor.execute(f"INSERT INTO pg_temp.{table} SELECT * FROM public.{table}")
    suffixed = {c: f"{c} || '-' || g" for c in ("idempotency_key", "external_request_id")}
    _clone(ToolCall, call.pk, BIG, suffixed)
    _clone(Attempt, attempt.pk, BIG, {"number": "number + g"})
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"ANALYZE pg_temp.{table}")
    try:
        yield run, small
    finally:
        with connection.cursor() as cursor:
            for table in TABLES:
                cursor.execute(f"DROP TABLE pg_temp.{table}")


def test_the_proposals_tally_keeps_its_generic_plan(runs: tuple[Run, Run]) -> None:
    big, small = runs
    params = [small.pk, small.tenant_id, "refund-order-v2", small.pk]
    assert _generic_plans(sql_propose._TALLY, params) > 0
    # Read from the copies (the big run's 5,001 calls), not through a statement this connection
    # prepared before they shadowed the tables. The answers against the tables themselves:
    # tests/test_toolcalls_sql_propose.py.
    params = [big.pk, big.tenant_id, "refund-order-v2", big.pk]
    assert _unprepared(sql_propose._TALLY, params)[0] == BIG + 1


def test_the_claims_readiness_keeps_its_generic_plan(runs: tuple[Run, Run]) -> None:
    big, small = runs
    target = [small.tenant_id, "refund-order-v2"]
    call_id = ToolCall.objects.get(run=small).pk
    assert _generic_plans(sql._READINESS, [small.pk, call_id, *target, *target]) > 0
    # As above; against the tables themselves: tests/test_toolcalls_sql.py.
    assert _unprepared(sql._READINESS, [big.pk, call_id, *target, *target])[0] == BIG + 1
