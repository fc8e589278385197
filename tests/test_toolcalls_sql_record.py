"""The record step's statements (toolcalls/sql.py, runs/sql.py, runs/outbox.py) write exactly
what the ORM statements they replace wrote: the attempts' ends, the object revisions, the
receipts and the verification messages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from runs import outbox
from runs import sql as runs_sql
from runs.models import OutboxMessage, Run
from tests.helpers import REFUND, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch_batch, sql
from toolcalls.models import Attempt, ObjectRevision, Receipt
from toolcalls.writes import VERIFY_TASK

pytestmark = pytest.mark.django_db
MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _values(obj: Any, *leave_out: str) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in leave_out
    }


def _attempts(run: Run, count: int) -> list[Attempt]:
    calls = [
        propose_in(run, {**REFUND, "amount_cents": 100 + i}, intent=f"a-{i}") for i in range(count)
    ]
    dispatch_batch.claim_batch([(call.pk, None) for call in calls])
    return list(Attempt.objects.filter(tool_call__in=calls).order_by("tool_call_id"))


ENDS = [
    ("confirmed", "", 200),
    ("retryable", "tool.rate_limited", 429),
    ("unknown", "tool.connection_lost", None),
]


def test_the_attempts_end_as_the_orms_update_ends_them(run: Run, sandbox: Sandbox) -> None:
    attempts = _attempts(run, 6)
    by_orm, by_sql = attempts[:3], attempts[3:]
    with transaction.atomic():
        for attempt, (classification, error_name, status) in zip(by_orm, ENDS, strict=True):
            Attempt.objects.filter(pk=attempt.pk).update(
                classification=classification,
                ended_at=MOMENT,
                error_name=error_name,
                http_status=status,
            )
        with CaptureQueriesContext(connection) as queries:
            sql.end_attempts(
                [
                    sql.AttemptEnd(attempt.pk, classification, MOMENT, error_name, status)
                    for attempt, (classification, error_name, status) in zip(
                        by_sql, ENDS, strict=True
                    )
                ]
            )
    assert len(queries) == 1
    # One JSON parameter, not an array per column (psycopg dumps those element by element).
    assert "json_to_recordset" in queries[0]["sql"] and "unnest" not in queries[0]["sql"]
    same = ("id", "tool_call_id", "number", "fencing_token", "started_at", "worker")
    for orm, written in zip(by_orm, by_sql, strict=True):
        orm.refresh_from_db()
        written.refresh_from_db()
        assert _values(written, *same) == _values(orm, *same)
        assert written.ended_at == MOMENT


def test_the_revisions_move_as_the_orms_updates_move_them(run: Run) -> None:
    tenant = run.tenant
    for ref in ("order:by-orm", "order:by-sql", "order:once"):
        ObjectRevision.objects.create(tenant=tenant, ref=ref, revision=3)
    before = {r.ref: r.updated_at for r in ObjectRevision.objects.all()}
    with transaction.atomic():
        for _ in range(2):  # two writes on one object in a batch
            ObjectRevision.objects.filter(tenant_id=tenant.pk, ref="order:by-orm").update(
                revision=F("revision") + 1
            )
        with CaptureQueriesContext(connection) as queries:
            moved = sql.bump_revisions(
                {
                    (tenant.pk, "order:by-sql"): 2,
                    (tenant.pk, "order:once"): 1,
                    (tenant.pk, "order:no-revision-row"): 1,
                }
            )
    assert len(queries) == 1
    assert moved == {(tenant.pk, "order:by-sql"), (tenant.pk, "order:once")}
    after = {r.ref: r for r in ObjectRevision.objects.all()}
    assert after["order:by-sql"].revision == after["order:by-orm"].revision == 5
    assert after["order:once"].revision == 4
    assert {ref: r.updated_at for ref, r in after.items()} == before  # as QuerySet.update
    assert not ObjectRevision.objects.filter(ref="order:no-revision-row").exists()


# A few rows go in a VALUES list, many (past psycopg's 50 cached parameters) as arrays.
@pytest.mark.parametrize("count", [2, 9])
def test_receipts_are_inserted_as_the_orm_creates_them(
    run: Run, sandbox: Sandbox, count: int
) -> None:
    first, second = _attempts(run, 2)
    body = {"id": "re_1", "amount": 2500, "nested": {"é": [1, 2.5, None]}}
    fields = {"external_id": "re_1", "status": "created", "source": "dispatch"}
    with transaction.atomic():
        orm = Receipt.objects.create(
            tool_call_id=first.tool_call_id, attempt=first, raw_response=body, **fields
        )
        written = [
            Receipt(tool_call_id=second.tool_call_id, attempt=second, raw_response=body, **fields),
            *[
                Receipt(tool_call_id=second.tool_call_id, attempt=None, raw_response={}, **fields)
                for _ in range(count - 1)
            ],
        ]
        with CaptureQueriesContext(connection) as queries:
            runs_sql.insert_rows(written)
    assert len(queries) == 1
    assert all(not receipt._state.adding for receipt in written)
    stored = Receipt.objects.get(pk=written[0].pk)
    leave_out = ("id", "tool_call_id", "attempt_id", "created_at")
    assert _values(stored, *leave_out) == _values(Receipt.objects.get(pk=orm.pk), *leave_out)
    assert stored.created_at == written[0].created_at is not None
    assert Receipt.objects.get(pk=written[1].pk).attempt_id is None


@pytest.mark.parametrize("count", [2, 9])
def test_verification_messages_are_written_as_enqueue_writes_them(run: Run, count: int) -> None:
    with transaction.atomic():
        orm = outbox.enqueue(VERIFY_TASK, "tc_one", publish_now=False)
        messages = [outbox.build(VERIFY_TASK, f"tc_{n}") for n in range(count)]
        with CaptureQueriesContext(connection) as queries:
            outbox.enqueue_many(messages, publish_now=False)
    assert len(queries) == 1
    leave_out = ("id", "args", "available_at", "created_at")
    for message in messages:
        stored = OutboxMessage.objects.get(pk=message.pk)
        assert _values(stored, *leave_out) == _values(
            OutboxMessage.objects.get(pk=orm.pk), *leave_out
        )
        assert stored.available_at == message.available_at <= stored.created_at
    stored = [OutboxMessage.objects.get(pk=m.pk).args for m in messages]
    assert stored == [[f"tc_{n}"] for n in range(count)]


def test_a_message_is_written_as_the_orm_created_it(run: Run) -> None:
    """`enqueue` writes its row with runs/sql.py's INSERT (every decision and claim writes
    one): the row `OutboxMessage.objects.create` wrote, with a countdown."""
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            written = outbox.enqueue(VERIFY_TASK, "tc_one", countdown=30, publish_now=False)
        orm = OutboxMessage.objects.create(
            task=VERIFY_TASK, args=["tc_one"], available_at=written.available_at
        )
    assert len(queries) == 1 and not written._state.adding
    leave_out = ("id", "created_at")
    stored = OutboxMessage.objects.get(pk=written.pk)
    assert _values(stored, *leave_out) == _values(OutboxMessage.objects.get(pk=orm.pk), *leave_out)
    assert stored.available_at - stored.created_at >= timedelta(seconds=29)


def test_a_claims_attempt_is_written_as_the_orms_bulk_create_wrote_it(
    run: Run, sandbox: Sandbox
) -> None:
    """A claim's attempts go in with runs/sql.py's INSERT (each claim writes one): the row
    `Attempt.objects.bulk_create` wrote."""
    [written] = _attempts(run, 1)
    fields = {f.attname: getattr(written, f.attname) for f in Attempt._meta.concrete_fields}
    with transaction.atomic():
        [orm] = Attempt.objects.bulk_create([Attempt(**{**fields, "id": None, "number": 99})])
    leave_out = ("id", "number")
    assert _values(Attempt.objects.get(pk=written.pk), *leave_out) == _values(
        Attempt.objects.get(pk=orm.pk), *leave_out
    )
    assert written.classification == "in_flight" and written.started_at is not None


def test_an_attempts_end_keeps_its_moment_to_the_microsecond_in_any_offset(
    run: Run, sandbox: Sandbox
) -> None:
    (attempt,) = _attempts(run, 1)
    paris = datetime(2026, 7, 1, 23, 59, 59, 1, tzinfo=timezone(timedelta(hours=2)))
    with transaction.atomic():
        sql.end_attempts([sql.AttemptEnd(attempt.pk, "confirmed", paris, "", 201)])
    attempt.refresh_from_db()
    assert attempt.ended_at == paris and attempt.ended_at.microsecond == 1
    assert (attempt.classification, attempt.error_name, attempt.http_status) == (
        "confirmed",
        "",
        201,
    )
