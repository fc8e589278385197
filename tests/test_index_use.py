"""The hot tables carry only indexes that some statement uses (issue 12 point 4).

Each INSERT, and each UPDATE that changes an indexed column (a call's status, an outbox row's
lease and `done_at`), writes an entry in every index of its table: an index no statement reads
is CPU on every call for nothing. This lists each index of the five tables a dispatched call
writes most, with what reads it; a new index is added here with its reader."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]

EXPECTED = {
    "runs_event": {
        "runs_event_pkey": "an event by id (the audit trail's links)",
        "event_unique_seq_per_run": "the run's chain head and its events in order",
        "runs_event_tenant__95d187_idx": "the tenant's events by time (eval traces)",
        "event_tool_call_seq": "a call's last event (its next event's cause)",
        "event_decision": "a decision's events (only events with one)",
        "event_approval": "an approval's events (only events with one)",
        "event_correlation": "events by correlation id (the API's filter)",
        "event_audit": "the audit page, newest first",
        "event_person": "a person's events on the audit page",
        "event_counted": "the dashboard's and /metrics' counted types",
    },
    "toolcalls_toolcall": {
        "toolcalls_toolcall_pkey": "a call by id",
        "toolcall_unique_key_per_tenant": "the proposal's idempotency key",
        "toolcall_obj": "the proposal's open calls on the object; the approval page",
        "toolcall_figures": "the dashboard's and /metrics' counts",
        "toolcall_desk": "the desk",
        "toolcalls_t_run_id_0c9543_idx": "a run's calls (run page, calls_in_run)",
        "toolcalls_t_executi_c1d76e_idx": "the sweeper's expired leases",
        "toolcall_one_compensation": "one compensation per call (calls that compensate)",
        "toolcalls_toolcall_external_request_id_key": "a call by its request id (lookups)",
        "toolcall_decision": "the foreign key's check on a decision (calls with one)",
        "toolcall_desk_owner": "the foreign key's check on a user (calls taken on the desk)",
    },
    "runs_outboxmessage": {
        "runs_outboxmessage_pkey": "mark_done, the sweeper's claim",
        "outbox_pending_idx": "the drainer's lease and the sweeper: undone rows only",
    },
    "toolcalls_receipt": {
        "toolcalls_receipt_pkey": "a receipt by id",
        "toolcalls_receipt_tool_call_id_0c194f80": "a call's receipts",
        "toolcalls_receipt_attempt_id_54446161": "the foreign key's check on an attempt",
        "receipt_replayed": "/metrics' deduplicated resends",
    },
    "toolcalls_attempt": {
        "toolcalls_attempt_pkey": "an attempt by id (its end)",
        "attempt_unique_number": "a call's attempts, numbered",
        "toolcalls_attempt_run_id_272b1edd": "the run's attempt budget (readiness)",
    },
}


def indexes(table: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
            " AND tablename = %s",
            [table],
        )
        return dict(cursor.fetchall())


@pytest.mark.parametrize("table", sorted(EXPECTED))
def test_each_index_of_a_hot_table_has_a_reader(table: str) -> None:
    assert sorted(indexes(table)) == sorted(EXPECTED[table])


@pytest.mark.parametrize("table", sorted(EXPECTED))
def test_no_like_twin_of_an_id_is_left(table: str) -> None:
    # Ids and foreign keys are compared whole; a varchar_pattern_ops twin only serves LIKE.
    assert not [d for d in indexes(table).values() if "pattern_ops" in d]
