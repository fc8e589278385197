"""An event batch told its calls locks their runs in one statement and reads their chain heads
in one more (runs/events.py, _Batch._lock_expected): the same rows as one-by-one appends, every
run locked before its head is read, in the order of ids."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from runs import events, services
from runs.models import Event, Run, Tenant

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks in one statement: PostgreSQL's"
)
MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
DEFERRED = {"error_name": "tool.circuit_open", "until": "2026-01-02T03:04:06Z"}


def _runs(tenant: Tenant, count: int = 3) -> list[Run]:
    started = [
        services.run_start(tenant=tenant, title=f"r{i}", actor="test")[0] for i in range(count)
    ]
    return sorted(started, key=lambda run: run.pk)


def _calls(runs: list[Run]) -> dict[str, str]:
    return {f"tc_{i}": run.pk for i, run in enumerate(runs)}


def _scenario(runs: list[Run], calls: dict[str, str]) -> None:
    """Each call's event, in the order of runs (as a dispatch batch handles its calls)."""
    by_id = {run.pk: run for run in runs}
    for call, run_id in calls.items():
        events.append(
            run=by_id[run_id], event_type="tool_call.deferred", payload=DEFERRED,
            producer="test", ids=events.Ids(tool_call_id=call),
        )  # fmt: skip


def _written(runs: list[Run], calls: dict[str, str], told: bool, monkeypatch: Any) -> list:
    counter = itertools.count(1)
    monkeypatch.setattr(
        Event._meta.get_field("id"), "_get_default", lambda: f"ev_test{next(counter):04d}"
    )
    monkeypatch.setattr(events.timezone, "now", lambda: MOMENT)
    with transaction.atomic():
        if told:
            with events.batch(calls):
                _scenario(runs, calls)
        else:
            _scenario(runs, calls)
        rows = list(
            Event.objects.filter(event_type="tool_call.deferred").order_by("run_id", "seq").values()
        )
        transaction.set_rollback(True)
    return rows


@pytest.mark.django_db
def test_a_batch_of_several_runs_writes_what_single_appends_write(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _runs(tenant)
    calls = _calls(runs)
    with transaction.atomic():
        _scenario(runs, calls)  # each call has an event already: its next one's cause
    single = _written(runs, calls, told=False, monkeypatch=monkeypatch)

    with CaptureQueriesContext(connection) as queries:
        told = _written(runs, calls, told=True, monkeypatch=monkeypatch)

    assert told == single
    assert len(told) == 6
    assert all(row["causation_id"] for row in told if row["seq"] > 2)
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]
    assert sum("FROM runs_run" in s and "FOR UPDATE" in s for s in statements) == 1
    assert sum("LATERAL" in s for s in statements) == 1
    assert sum("DISTINCT ON (tool_call_id)" in s for s in statements) == 1
    # The batch's whole cost: lock, heads, the calls' last events, one INSERT (then the read
    # of the rows above).
    assert sum(s.startswith('INSERT INTO "runs_event"') for s in statements) == 1
    assert len(statements) == 5, "\n".join(s[:80] for s in statements)


def _locked_elsewhere(run_id: str) -> bool:
    """Whether another transaction holds the run's row (asked from a second connection)."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE NOWAIT", [run_id])
        return False
    except DatabaseError:
        return True
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_the_runs_are_locked_from_the_first_one_written_about_on(tenant: Tenant) -> None:
    runs = _runs(tenant, 4)
    calls = _calls(runs)
    with transaction.atomic(), events.batch(calls):
        events.append(
            run=runs[1], event_type="tool_call.deferred", payload=DEFERRED,
            producer="test", ids=events.Ids(tool_call_id="tc_1"),
        )  # fmt: skip
        # Not the first run: locking it now would take a lower id after a higher one.
        assert [_locked_elsewhere(run.pk) for run in runs] == [False, True, True, True]
        events.append(run=runs[0], event_type="decision.recorded", producer="test", payload={
            "kind": "k", "version": 1, "content": {}, "supersedes": None,
        })  # fmt: skip
        assert _locked_elsewhere(runs[0].pk)
    assert events.verify_chain(Event.objects.order_by("run_id", "seq")) == []
    assert Event.objects.filter(run=runs[0]).count() == 2


@pytest.mark.django_db
def test_a_batch_refuses_an_event_of_a_missing_run(tenant: Tenant) -> None:
    runs = _runs(tenant, 2)
    missing = Run(pk="run_0", tenant=tenant)  # before every real id: the first locked
    calls = {"tc_x": missing.pk, **_calls(runs)}
    with pytest.raises(Run.DoesNotExist), transaction.atomic(), events.batch(calls):
        events.append(
            run=missing, event_type="tool_call.deferred", payload=DEFERRED,
            producer="test", ids=events.Ids(tool_call_id="tc_x"),
        )  # fmt: skip
