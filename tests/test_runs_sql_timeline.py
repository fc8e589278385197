"""runs/sql.py reads the run page's timeline window as the ORM's values_list does: the same
events, columns and decoded payloads, latest first, before a sequence number or not."""

from __future__ import annotations

import pytest

from runs import services, sql
from runs.models import Event, Run, Tenant
from runs.selectors import TimelineEvent

pytestmark = pytest.mark.django_db


def _orm(run: Run, size: int, before: int | None) -> list[tuple]:
    events = Event.objects.filter(run=run)
    if before is not None:
        events = events.filter(seq__lt=before)
    return list(events.order_by("-seq").values_list(*TimelineEvent._fields)[:size])


@pytest.mark.parametrize(("size", "before"), [(50, None), (4, None), (3, 6), (50, 2), (5, 1)])
def test_it_reads_the_window_the_orm_reads(
    run: Run, tenant: Tenant, size: int, before: int | None
) -> None:
    for n in range(7):
        content = {"step": n, "nested": {"list": [n, "é", None]}}
        services.decision_record(
            tenant=tenant, run_id=run.pk, kind=f"k{n}", content=content, actor="t"
        )

    rows = sql.timeline_window(run.pk, size, before)

    assert rows == _orm(run, size, before)
    assert rows or before == 1
