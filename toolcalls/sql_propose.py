"""A proposal's statement once its run is locked: the run's tally, and the call's INSERT.

What a proposal needs after the run's lock — its calls (the budget), its last event (the
chain head its events follow), the capability's newest policy id — is one statement instead
of four (the count, the events' second lock of the run and their chain-head read, the policy's
id). It must follow the lock, not join it: a read in the locking statement sees the snapshot
from before the lock was granted (runs/sql.py, lock_and_read_head). When nothing has to be
checked between the count and the INSERT (no object revision), the call's INSERT is in that
statement too, made only if the run has room. tests/test_toolcalls_sql_propose.py proves the
reads and the row are the ORM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection

from toolcalls.models import ToolCall
from toolcalls.sql import _CALL, call_inserted, call_values, calls_in_run

_TALLY = (
    "SELECT (SELECT count(*) FROM toolcalls_toolcall WHERE run_id = %s) AS calls,"
    " (SELECT id FROM approvals_policy WHERE tenant_id = %s AND capability_id = %s"
    " ORDER BY version DESC LIMIT 1) AS policy_id, h.id, h.seq, h.hash"
    " FROM (SELECT 1) AS one LEFT JOIN (SELECT id, seq, hash FROM runs_event"
    " WHERE run_id = %s ORDER BY seq DESC LIMIT 1) AS h ON true"
)
# The INSERT sees the statement's snapshot, as the tally does: the count excludes the call.
_TALLY_AND_INSERT = (
    f"WITH t AS ({_TALLY}), i AS (INSERT INTO toolcalls_toolcall"
    f" ({', '.join(f.column for f in _CALL)})"
    f" SELECT {', '.join(['%s'] * len(_CALL))} FROM t WHERE t.calls < %s RETURNING 1)"
    " SELECT t.*, EXISTS (SELECT 1 FROM i) FROM t"
)


@dataclass(frozen=True)
class RunTally:
    calls: int  # the run's tool calls (before this one)
    newest_policy_id: int | None  # approvals.sql.newest_policy_id of the capability
    head_read: bool  # False: `head` was not read (SQLite), the events read it themselves
    head: dict[str, Any] | None = None  # the run's last event (id, seq, hash); None: none yet
    inserted: bool = False  # the call's row was written by the same statement


def run_tally(*, run_id: str, tenant_id: int, capability_id: str) -> RunTally:
    """For a run this transaction has locked: its calls, its chain head, the newest policy."""
    if connection.vendor != "postgresql":
        return RunTally(calls_in_run(run_id), None, head_read=False)
    with connection.cursor() as cursor:
        cursor.execute(_TALLY, [run_id, tenant_id, capability_id, run_id])
        return _tally(*cursor.fetchone())


def run_tally_and_insert(call: ToolCall, *, max_calls: int) -> RunTally:
    """`run_tally` of the call's run (locked), and `insert_call(call)` in the same statement
    when the run has fewer than `max_calls` calls (`inserted`)."""
    if connection.vendor != "postgresql":
        return run_tally(
            run_id=call.run_id, tenant_id=call.tenant_id, capability_id=call.capability_id
        )
    tally = [call.run_id, call.tenant_id, call.capability_id, call.run_id]
    with connection.cursor() as cursor:
        cursor.execute(_TALLY_AND_INSERT, [*tally, *call_values(call), max_calls])
        found = _tally(*cursor.fetchone())
    if found.inserted:
        call_inserted(call)
    return found


def _tally(calls: int, policy_id: int | None, *rest: Any) -> RunTally:
    last, inserted = rest[:3], rest[3] if len(rest) > 3 else False
    head = None if last[0] is None else dict(zip(("id", "seq", "hash"), last, strict=True))
    return RunTally(calls, policy_id, head_read=True, head=head, inserted=inserted)
