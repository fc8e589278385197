"""The event log at the database: append-only trigger, concurrent appends, replay checks."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, IntegrityError, connection, connections, transaction

from runs import events, services
from runs.models import Event, Run, Tenant
from toolcalls.lifecycle import run_stop


@pytest.fixture
def logged_run(run: Run, tenant: Tenant) -> Run:
    """A run with a decision, stopped: three events."""
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="eligibility", content={"ok": True}, actor="test"
    )
    run_stop(tenant=tenant, run_id=run.pk, actor="test", reason="done")
    return run


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE runs_event SET event_type = 'run.tampered'",
        "DELETE FROM runs_event",
        "TRUNCATE runs_event CASCADE",
    ],
)
def test_the_database_refuses_to_rewrite_events(statement: str, run: Run, tenant: Tenant) -> None:
    # Committed rows, as in production: TRUNCATE in the same transaction as the inserts
    # would fail for another reason (pending foreign-key checks).
    run_stop(tenant=tenant, run_id=run.pk, actor="test")
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert Event.objects.filter(run=run).count() == 2


def tamper(sql: str, params: list[object]) -> None:
    """Change an event behind the log's back, the way only a maintenance session could."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
        cursor.execute(sql, params)


def test_verify_event_chain_passes_after_normal_use(logged_run: Run, capsys) -> None:
    call_command("verify_event_chain")
    assert "OK: 3 events" in capsys.readouterr().out


def test_verify_event_chain_catches_a_changed_payload(logged_run: Run, capsys) -> None:
    tamper(
        "UPDATE runs_event SET payload = %s WHERE run_id = %s AND seq = 2",
        [
            '{"kind": "eligibility", "version": 1, "content": {"ok": false}, "supersedes": null}',
            logged_run.pk,
        ],
    )
    with pytest.raises(CommandError, match="1 problems"):
        call_command("verify_event_chain")
    assert f"{logged_run.pk}#2" in capsys.readouterr().out


def test_verify_event_chain_catches_a_deleted_event(logged_run: Run, capsys) -> None:
    tamper("DELETE FROM runs_event WHERE run_id = %s AND seq = 2", [logged_run.pk])
    with pytest.raises(CommandError):
        call_command("verify_event_chain")
    assert "sequence gap" in capsys.readouterr().out


def test_rebuild_projections_passes_after_normal_use(logged_run: Run, capsys) -> None:
    call_command("rebuild_projections", "--verify")
    assert "OK: replayed 3 events" in capsys.readouterr().out


def test_rebuild_projections_catches_a_state_changed_behind_the_log(
    logged_run: Run, capsys
) -> None:
    Run.objects.filter(pk=logged_run.pk).update(state="completed")
    # Two projections see it: the run's state, and the exit its eval trace reads in the log.
    with pytest.raises(CommandError, match="2 differences"):
        call_command("rebuild_projections", "--verify")
    out = capsys.readouterr().out
    assert f"run {logged_run.pk}: state stored='completed' rebuilt='cancelled'" in out
    assert f"eval_trace {logged_run.pk}: exit stored='completed' rebuilt='cancelled'" in out


def test_rebuild_projections_catches_an_event_changed_behind_the_table(
    logged_run: Run, capsys
) -> None:
    tamper(
        "UPDATE runs_event SET payload = jsonb_set(payload, '{to}', '\"completed\"') "
        "WHERE run_id = %s AND event_type = 'run.cancelled'",
        [logged_run.pk],
    )
    with pytest.raises(CommandError):
        call_command("rebuild_projections", "--verify")
    assert "stored='cancelled' rebuilt='completed'" in capsys.readouterr().out


def test_rebuild_projections_wants_verify(db: None) -> None:
    with pytest.raises(CommandError, match="--verify"):
        call_command("rebuild_projections")


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_get_distinct_sequence_numbers(run: Run) -> None:
    workers, appends_each = 4, 15
    barrier = threading.Barrier(workers)
    failures: list[BaseException] = []

    def append_many() -> None:
        try:
            barrier.wait()
            for _ in range(appends_each):
                with transaction.atomic():
                    events.append(
                        run=run,
                        event_type="run.waiting",
                        payload={"from": "active", "to": "waiting"},
                        producer="test",
                    )
        except BaseException as exc:  # reported to the main thread
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=append_many) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, 1 + 1 + workers * appends_each))
    assert events.verify_chain(Event.objects.filter(run=run).order_by("seq")) == []


@pytest.mark.django_db(transaction=True)
def test_an_append_without_the_lock_fails_cleanly_on_the_unique_sequence(
    run: Run, tenant: Tenant
) -> None:
    first = Event.objects.get(run=run)
    duplicate = Event(
        run=run,
        seq=first.seq,
        event_type=first.event_type,
        schema_version=1,
        producer="x",
        tenant=tenant,
        occurred_at=first.occurred_at,
        recorded_at=first.recorded_at,
        payload={},
        prev_hash=first.prev_hash,
        hash="f" * 64,
    )
    with pytest.raises(IntegrityError, match="event_unique_seq_per_run"):
        duplicate.save(force_insert=True)
    assert Event.objects.filter(run=run).count() == 1
