"""Columns empty on nearly every row are indexed where set only (issue 12: PostgreSQL's CPU
per call), and each such index still serves every look-up by value and keeps its rule.

A dispatched call is written about three times (never HOT) and logs seven events; a btree
holds an entry for every NULL or blank, so indexing the rows that have a value spares those
writes. `x = $1` implies `x IS NOT NULL` (= is strict), so the planner uses the partial index
even in a prepared statement's generic plan, the form of the foreign keys' own checks."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from runs.models import Run
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]

# (index, table, column, the predicate as PostgreSQL prints it, casts left out)
PARTIAL = [
    ("toolcall_decision", "toolcalls_toolcall", "decision_id", "(decision_id IS NOT NULL)"),
    ("toolcall_desk_owner", "toolcalls_toolcall", "desk_owner_id", "(desk_owner_id IS NOT NULL)"),
    (
        "toolcall_one_compensation",
        "toolcalls_toolcall",
        "compensation_of_id",
        "(compensation_of_id IS NOT NULL)",
    ),
    ("event_decision", "runs_event", "decision_id", "(NOT ((decision_id) = ''))"),
    ("event_approval", "runs_event", "approval_id", "(NOT ((approval_id) = ''))"),
]


def generic_plan(sql: str) -> str:
    """The plan PostgreSQL keeps for `sql` prepared with one parameter (of the column's type),
    seq scans off (a test table of a few rows would rightly be read whole)."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute(f"PREPARE partial_probe AS {sql}")
            cursor.execute("EXPLAIN EXECUTE partial_probe('1')")
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE partial_probe")
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("RESET enable_seqscan")


def constant_plan(sql: str, value: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(f"EXPLAIN {sql.replace('$1', '%s')}", [value])
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")


@pytest.mark.parametrize(("index", "table", "column", "predicate"), PARTIAL)
def test_the_index_holds_only_rows_with_a_value(
    index: str, table: str, column: str, predicate: str
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [index])
        (definition,) = cursor.fetchone()
    assert definition.replace("::text", "").endswith(f" WHERE {predicate}")


@pytest.mark.parametrize(
    ("index", "table", "column"),
    [(index, table, column) for index, table, column, where in PARTIAL if "NULL" in where],
)
def test_a_look_up_by_value_reads_it_even_in_a_generic_plan(
    index: str, table: str, column: str
) -> None:
    # The foreign key's check when a decision or user is deleted has this form.
    assert index in generic_plan(f"SELECT 1 FROM {table} WHERE {column} = $1")


@pytest.mark.parametrize(
    ("index", "table", "column"),
    [(index, table, column) for index, table, column, where in PARTIAL if "''" in where],
)
def test_a_look_up_of_an_id_reads_it(index: str, table: str, column: str) -> None:
    assert index in constant_plan(f"SELECT 1 FROM {table} WHERE {column} = $1", "apr_1")


def test_a_call_still_has_at_most_one_compensation(run: Run, sandbox: Sandbox) -> None:
    original = propose_in(run, intent="original")
    first = propose_in(run, intent="first")
    second = propose_in(run, intent="second")
    ToolCall.objects.filter(pk=first.pk).update(compensation_of=original)
    with pytest.raises(IntegrityError), transaction.atomic():
        ToolCall.objects.filter(pk=second.pk).update(compensation_of=original)
    # Calls that compensate nothing are many, as before.
    assert ToolCall.objects.filter(compensation_of__isnull=True).count() == 2
