"""runs/sql.py `update_fields` (a transition's save) leaves the row that
`save(update_fields=…)` leaves: the same columns written, auto_now set, the others untouched."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from runs import sql
from runs.models import Run
from runs.services import run_start, run_transition
from runs.transitions import saved_together
from tests.helpers import REFUND, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import lifecycle
from toolcalls.models import ToolCall

pytestmark = pytest.mark.django_db
MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _values(obj: Any, *leave_out: str) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in leave_out
    }


def _change(call: ToolCall) -> None:
    """What a record does to a call: a JSON result, dates, a status (and its protected field)."""
    call.result = {"id": "re_1", "amount": 2500, "nested": {"é": [1, 2.5, None]}}
    call.external_id, call.lease_expires_at, call.status_since = "re_1", None, MOMENT
    call.last_error_message = "it's \"quoted\" %s"
    call.cancel()


def test_the_row_is_the_one_the_orms_save_leaves(run: Run, sandbox: Sandbox) -> None:
    by_orm = propose_in(run, {**REFUND, "amount_cents": 7}, intent="orm")
    by_sql = propose_in(run, {**REFUND, "amount_cents": 8}, intent="sql")
    with transaction.atomic():
        orm, written = (ToolCall.objects.get(pk=c.pk) for c in (by_orm, by_sql))
        for call in (orm, written):
            _change(call)
        changed = written.changed_fields()
        assert set(changed) >= {"result", "execution_status", "updated_at", "status_since"}
        assert "args" not in changed
        orm.save(update_fields=orm.changed_fields())
        with CaptureQueriesContext(connection) as queries:
            sql.update_fields(written, changed)

    assert len(queries) == 1 and queries[0]["sql"].startswith('UPDATE "toolcalls_toolcall" SET')
    assert written.changed_fields() == ["updated_at"]  # it remembers what it wrote
    leave_out = ("id", "args", "args_digest", "idempotency_key", "external_request_id")
    stored, expected = ToolCall.objects.get(pk=by_sql.pk), ToolCall.objects.get(pk=by_orm.pk)
    assert _values(stored, *leave_out, "intent", "created_at", "updated_at") == _values(
        expected, *leave_out, "intent", "created_at", "updated_at"
    )
    assert stored.updated_at == written.updated_at > by_sql.updated_at
    assert (stored.args, stored.intent) == (by_sql.args, by_sql.intent)  # not written


def test_a_row_that_is_gone_raises_as_the_orm_does(run: Run, sandbox: Sandbox) -> None:
    call = ToolCall.objects.get(pk=propose_in(run).pk)
    call.pk = "tc_gone"
    with pytest.raises(DatabaseError, match="did not affect any rows"), transaction.atomic():
        sql.update_fields(call, ["external_id"])


def test_a_runs_transition_writes_only_what_changed(run: Run) -> None:
    """A run is saved by each wait, resume and end (every approval's decision resumes one): its
    changed columns, not all fifteen through the ORM's save. The row is the one a whole save
    leaves."""
    run.metadata = {"k": "v"}
    run.save()
    with transaction.atomic():
        locked = lifecycle.run_lock(run.pk)
        with CaptureQueriesContext(connection) as queries:
            run_transition(locked, "wait", actor="test", producer="test", reason="r")
    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "runs_run"')]
    assert len(updates) == 1
    assert updates[0].split(" WHERE ")[0].count(" = ") == 2  # state and updated_at
    stored = Run.objects.get(pk=run.pk)
    assert stored.state == "waiting" and stored.updated_at == locked.updated_at
    assert _values(stored, "state", "updated_at") == _values(run, "state", "updated_at")


def test_many_rows_in_one_statement_are_the_ones_the_orms_saves_leave(
    run: Run, sandbox: Sandbox
) -> None:
    by_orm = [propose_in(run, {**REFUND, "amount_cents": 7 + i}, intent=f"o{i}") for i in range(2)]
    by_sql = [propose_in(run, {**REFUND, "amount_cents": 9 + i}, intent=f"s{i}") for i in range(2)]
    with transaction.atomic():
        orm = [ToolCall.objects.get(pk=c.pk) for c in by_orm]
        written = [ToolCall.objects.get(pk=c.pk) for c in by_sql]
        for call in orm + written:
            _change(call)
        written[1].result = {"other": True}  # each row its own values
        orm[1].result = {"other": True}
        for call in orm:
            call.save(update_fields=call.changed_fields())
        with CaptureQueriesContext(connection) as queries:
            sql.update_many(written, written[0].changed_fields())

    assert len(queries) == 1 and queries[0]["sql"].startswith('UPDATE "toolcalls_toolcall" AS')
    assert [call.changed_fields() for call in written] == [["updated_at"]] * 2
    leave_out = ("id", "args", "args_digest", "idempotency_key", "external_request_id")
    for mine, theirs, before in zip(written, orm, by_sql, strict=True):
        stored, expected = ToolCall.objects.get(pk=mine.pk), ToolCall.objects.get(pk=theirs.pk)
        times = ("intent", "created_at", "updated_at")
        assert _values(stored, *leave_out, *times) == _values(expected, *leave_out, *times)
        assert stored.updated_at == mine.updated_at > before.updated_at
        assert (stored.args, stored.intent) == (before.args, before.intent)  # not written


def test_many_rows_with_one_gone_raise(run: Run, sandbox: Sandbox) -> None:
    calls = [ToolCall.objects.get(pk=propose_in(run, intent=f"g{i}").pk) for i in range(2)]
    calls[1].pk = "tc_gone"
    with pytest.raises(DatabaseError, match="did not affect every row"), transaction.atomic():
        sql.update_many(calls, ["external_id"])


def test_rows_saved_together_are_only_those_that_took_a_transition(run: Run) -> None:
    other, _ = run_start(tenant=run.tenant, title="other", actor="test")
    with transaction.atomic():
        moved, still = lifecycle.run_lock(run.pk), lifecycle.run_lock(other.pk)
        with CaptureQueriesContext(connection) as queries, saved_together([moved, still]):
            run_transition(moved, "wait", actor="test", producer="test", reason="r")
            assert Run.objects.get(pk=run.pk).state == run.state  # not saved yet

    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "runs_run"')]
    assert len(updates) == 1 and Run.objects.get(pk=run.pk).state == "waiting"
    assert Run.objects.get(pk=other.pk).updated_at == other.updated_at  # not written
