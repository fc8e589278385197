"""runs/sql.py and event batches write exactly what one-by-one appends write: the same rows,
the same hashes, with one chain-head read per run and one INSERT per batch."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from runs import events
from runs.models import Event, Run

pytestmark = pytest.mark.django_db
MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _scenario(run: Run) -> None:
    """Two calls' events and run-level ones, interleaved, as a write path makes them."""
    first, second = events.Ids(tool_call_id="tc_one"), events.Ids(tool_call_id="tc_two")
    deferred = {"error_name": "tool.circuit_open", "until": "2026-01-02T03:04:06Z"}
    for ids in (first, second, first, events.NO_IDS, first):
        if ids is events.NO_IDS:
            payload = {"kind": "k", "version": 1, "content": {"b": [1, 2], "a": "é"}}
            events.append(
                run=run,
                event_type="decision.recorded",
                payload={**payload, "supersedes": None},
                producer="test",
            )
        else:
            events.append(
                run=run,
                event_type="tool_call.deferred",
                payload=deferred,
                producer="test",
                actor="system:test",
                ids=ids,
            )


def _written(
    run: Run,
    batched: bool,
    monkeypatch: pytest.MonkeyPatch,
    calls: dict[str, str] | None = None,
    held: bool = False,
) -> list[dict[str, Any]]:
    """The rows the scenario writes after the run's existing events, then rolled back; with
    the same ids and clock each time, so that two ways of writing can be compared."""
    counter = itertools.count(1)
    monkeypatch.setattr(
        Event._meta.get_field("id"), "_get_default", lambda: f"ev_test{next(counter):04d}"
    )
    monkeypatch.setattr(events.timezone, "now", lambda: MOMENT)
    before = Event.objects.filter(run=run).count()
    with transaction.atomic():
        if held:  # as the approver's decision locks its run, before its batch
            list(Run.objects.select_for_update().filter(pk=run.pk))
        if batched:
            with events.batch(calls, held=[run.pk] if held else ()):
                _scenario(run)
        else:
            _scenario(run)
        rows = list(Event.objects.filter(run=run, seq__gt=before).order_by("seq").values())
        transaction.set_rollback(True)
    return rows


def test_a_batch_writes_the_same_rows_and_hashes_as_single_appends(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    single = _written(run, batched=False, monkeypatch=monkeypatch)
    batched = _written(run, batched=True, monkeypatch=monkeypatch)

    assert len(single) == 5
    assert batched == single
    causes = [row["causation_id"] for row in batched]
    assert causes == ["", "", "ev_test0001", "", "ev_test0003"]


def test_a_batch_told_its_calls_finds_their_last_events_as_single_appends_do(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    with transaction.atomic():
        _scenario(run)  # both calls have events already: their causes are read from the log
    single = _written(run, batched=False, monkeypatch=monkeypatch)

    with CaptureQueriesContext(connection) as queries:
        told = _written(
            run, batched=True, monkeypatch=monkeypatch, calls={"tc_one": run.pk, "tc_two": run.pk}
        )

    assert told == single
    assert all(row["causation_id"] for row in told if row["tool_call_id"])
    assert sum("DISTINCT ON (tool_call_id)" in q["sql"] for q in queries) == 1


def test_a_batch_of_a_run_locked_already_reads_its_head_without_locking_it_again(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    with transaction.atomic():
        _scenario(run)  # a chain head to read
    single = _written(run, batched=False, monkeypatch=monkeypatch)

    with CaptureQueriesContext(connection) as queries:
        held = _written(run, batched=True, monkeypatch=monkeypatch, held=True)

    assert held == single
    # The caller's lock only; the head read, the second call's last event, one INSERT.
    locks = [q["sql"] for q in queries if "FOR UPDATE" in q["sql"]]
    assert len(locks) == 1
    assert sum(q["sql"].startswith("SELECT id, seq, hash") for q in queries) == 1


def test_the_batch_is_a_valid_continuation_of_the_chain(run: Run) -> None:
    with transaction.atomic(), events.batch():
        _scenario(run)

    assert events.verify_chain(Event.objects.filter(run=run).order_by("seq")) == []


def test_a_batch_reads_the_head_once_and_inserts_once(run: Run) -> None:
    with transaction.atomic(), CaptureQueriesContext(connection) as single:
        _scenario(run)
    with transaction.atomic(), CaptureQueriesContext(connection) as batched, events.batch():
        _scenario(run)

    def inserts(queries: CaptureQueriesContext) -> int:
        return sum(q["sql"].startswith('INSERT INTO "runs_event"') for q in queries)

    assert (len(single), inserts(single)) == (15, 5)  # lock, read, insert per event
    # Lock and read once; the second call's last event; one INSERT.
    assert (len(batched), inserts(batched)) == (4, 1)


def test_nothing_is_appended_in_a_savepoint_inside_a_batch(run: Run) -> None:
    with (
        transaction.atomic(),
        events.batch(),
        transaction.atomic(),
        pytest.raises(RuntimeError, match="savepoint"),
    ):
        _scenario(run)


def test_a_failed_batch_writes_nothing(run: Run) -> None:
    before = Event.objects.filter(run=run).count()
    with pytest.raises(ZeroDivisionError), transaction.atomic(), events.batch():
        _scenario(run)
        1 / 0  # noqa: B018

    assert Event.objects.filter(run=run).count() == before
