"""verify_event_chain reports a problem per event and never stops early: an event whose
payload cannot be canonicalised any more is one problem, and every event after it, of its
run and of the runs after it, is still checked."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from runs import services
from runs.events import verify_chain
from runs.models import Event, Run, Tenant
from toolcalls.lifecycle import run_stop


def logged_run(tenant: Tenant, title: str) -> Run:
    run, _ = services.run_start(tenant=tenant, title=title, actor="test")
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="eligibility", content={"ok": True}, actor="test"
    )
    run_stop(tenant=tenant, run_id=run.pk, actor="test", reason="done")
    return run


def tamper(run: Run, seq: int, payload_sql: str) -> None:
    """Rewrite one event's payload through the test bypass of the append-only trigger."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
        cursor.execute(
            f"UPDATE runs_event SET payload = {payload_sql} WHERE run_id = %s AND seq = %s",
            [run.pk, seq],
        )


@pytest.fixture
def two_runs(tenant: Tenant) -> tuple[Run, Run]:
    first, second = logged_run(tenant, "first"), logged_run(tenant, "second")
    assert first.pk < second.pk  # the verifier walks runs in id order
    # jsonb keeps 1e300 as an exact decimal and gives it back as a 301-digit integer, which
    # RFC 8785 refuses: the hash of this event cannot be computed any more.
    tamper(first, 2, "'{\"x\": 1e300}'::jsonb")
    tamper(first, 3, '\'{"reason": "changed"}\'::jsonb')
    tamper(second, 2, '\'{"content": {"ok": false}}\'::jsonb')
    return first, second


def test_it_reports_every_problem_after_an_event_it_cannot_canonicalise(
    two_runs: tuple[Run, Run], capsys
) -> None:
    first, second = two_runs
    with pytest.raises(CommandError, match="3 problems in 6 events"):
        call_command("verify_event_chain")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{first.pk}#2 ")
    assert "cannot be canonicalised" in lines[0]
    assert "IntegerDomainError" in lines[0]
    assert lines[1].startswith(f"{first.pk}#3 ")
    assert "content does not match its hash" in lines[1]
    assert lines[2].startswith(f"{second.pk}#2 ")
    assert "content does not match its hash" in lines[2]


def test_the_link_after_an_unreadable_event_is_still_checked(two_runs: tuple[Run, Run]) -> None:
    first, _ = two_runs
    # A broken link right after the unreadable event is caught too.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
        cursor.execute(
            "UPDATE runs_event SET prev_hash = %s WHERE run_id = %s AND seq = 3",
            ["f" * 64, first.pk],
        )
    problems = verify_chain(Event.objects.order_by("run_id", "seq"))
    assert [p.split(" ")[0] for p in problems] == [
        f"{first.pk}#2",
        f"{first.pk}#3",
        f"{first.pk}#3",
        f"{two_runs[1].pk}#2",
    ]
    assert "prev_hash does not match" in problems[1]


def test_a_payload_that_cannot_even_be_loaded_is_one_problem(
    two_runs: tuple[Run, Run], capsys
) -> None:
    first, second = two_runs
    # 5,001 digits: more than Python converts to an int (4,300), so json.loads refuses it.
    tamper(first, 1, "'{\"x\": 1e5000}'::jsonb")
    with pytest.raises(CommandError, match="4 problems in 6 events"):
        call_command("verify_event_chain")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{first.pk}#1 ")
    assert "payload cannot be loaded" in lines[0]
    assert [line.split(" ")[0] for line in lines[1:]] == [
        f"{first.pk}#2",
        f"{first.pk}#3",
        f"{second.pk}#2",
    ]
