"""`field__any=ids` (runs/lookups.py): the rows `__in` finds, by one array parameter on
PostgreSQL rather than a placeholder per id (rebuild_projections reads each batch's stored
rows by it)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import Decision, Run, Tenant


def _runs_with_decisions(tenant: Tenant, count: int) -> list[Run]:
    runs = []
    for i in range(count):
        run, _ = services.run_start(tenant=tenant, title=f"run {i}", actor="test")
        services.decision_record(
            tenant=tenant, run_id=run.pk, kind="judgment", content={"i": i}, actor="test"
        )
        runs.append(run)
    return runs


def test_it_finds_what_in_finds_by_key_and_by_foreign_key(tenant: Tenant) -> None:
    runs = _runs_with_decisions(tenant, 4)
    ids = [runs[0].pk, runs[2].pk, "run_not_there"]
    assert sorted(Run.objects.filter(pk__any=ids).values_list("id", flat=True)) == sorted(
        Run.objects.filter(pk__in=ids).values_list("id", flat=True)
    )
    by_any = Decision.objects.filter(run_id__any=ids).values_list("id", "run_id")
    by_in = Decision.objects.filter(run_id__in=ids).values_list("id", "run_id")
    assert sorted(by_any) == sorted(by_in) and len(by_any) == 2


def test_it_sends_one_array_parameter_however_many_ids(tenant: Tenant) -> None:
    runs = _runs_with_decisions(tenant, 2)
    ids = [runs[1].pk] + [f"run_{i}" for i in range(3000)]
    with CaptureQueriesContext(connection) as queries:
        found = list(Decision.objects.filter(run_id__any=ids).values_list("run_id", flat=True))
    assert found == [runs[1].pk]
    sql = queries.captured_queries[0]["sql"]
    assert '"runs_decision"."run_id" = ANY(' in sql and " IN (" not in sql, sql[:300]


def test_no_ids_find_nothing(tenant: Tenant) -> None:
    _runs_with_decisions(tenant, 1)
    assert list(Decision.objects.filter(run_id__any=[])) == []
    assert list(Run.objects.filter(pk__any=[])) == []
