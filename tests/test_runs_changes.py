"""A transition writes only the columns it changed (runs/changes.py), and the row it leaves is
the row that a whole-row save leaves."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run
from tests.helpers import REFUND, fresh, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch
from toolcalls.models import ToolCall

pytestmark = pytest.mark.django_db
# Columns that differ between two calls whatever the way of saving.
OWN = {
    "id",
    "intent",
    "idempotency_key",
    "external_request_id",
    "external_id",
    "result",
    "args",
    "args_digest",
    "object_ref",
    "created_at",
    "status_since",  # when this call entered its status, like its other times
    "updated_at",
    "lease_expires_at",
}


def _row(call: ToolCall) -> dict[str, Any]:
    row = ToolCall.objects.filter(pk=call.pk).values().get()
    return {key: value for key, value in row.items() if key not in OWN}


def test_a_dispatch_updates_only_the_columns_it_changed(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    with CaptureQueriesContext(connection) as queries:
        dispatch.tool_call_dispatch(tool_call_id=call.pk)

    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "toolcalls_toolcall"')]
    assert updates, "the dispatch wrote the call"
    for sql in updates:
        assert '"args"' not in sql and '"intent"' not in sql and '"run_id"' not in sql
    assert fresh(call).execution_status == "completed"


def test_the_row_is_the_one_a_whole_row_save_writes(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    lean = propose_in(run, intent="lean")
    dispatch.tool_call_dispatch(tool_call_id=lean.pk)
    monkeypatch.setattr(ToolCall, "changed_fields", lambda self: None)
    whole = propose_in(run, {**REFUND, "order_id": "order-003"}, intent="whole")
    dispatch.tool_call_dispatch(tool_call_id=whole.pk)

    assert _row(lean) == _row(whole)
    assert fresh(lean).result["refund_id"] == fresh(lean).external_id


def test_a_json_value_changed_in_place_is_written(run: Run, sandbox: Sandbox) -> None:
    call = fresh(propose_in(run))
    call.args["reason"] = "changed in place"

    assert call.changed_fields() == ["args", "updated_at"]
    call.save(update_fields=call.changed_fields())
    assert fresh(call).args["reason"] == "changed in place"
    assert call.changed_fields() == ["updated_at"]


def test_a_row_read_deferred_remembers_what_it_read_and_only_that(
    run: Run, sandbox: Sandbox
) -> None:
    propose_in(run)
    # Two shapes of deferred read, each remembered by its own columns (runs/changes.py keeps
    # the columns of each shape once): what was read is compared, what was not is not.
    lean = ToolCall.objects.filter(run=run).defer("args", "result").get()
    leaner = ToolCall.objects.filter(run=run).only("id", "intent", "result").get()

    assert "args" not in lean._saved_values and "result" not in lean._saved_values
    assert set(leaner._saved_values) == {"id", "intent", "result"}
    assert lean.changed_fields() == ["updated_at"]
    lean.intent = "renamed"
    leaner.result = {"read": "then changed"}
    assert lean.changed_fields() == ["intent", "updated_at"]
    assert leaner.changed_fields() == ["result"]
