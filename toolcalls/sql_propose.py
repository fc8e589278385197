"""A proposal's statements once its run is locked: the run's tally, then the call's INSERT in
the state its policy decided, with its dispatch message.

What a proposal needs after the run's lock — its calls (the budget), its last event (the
chain head its events follow), the capability's newest policy id — is one statement instead
of four (the count, the events' second lock of the run and their chain-head read, the policy's
id). It must follow the lock, not join it: a read in the locking statement sees the snapshot
from before the lock was granted (runs/sql.py, lock_and_read_head).

The call is then written once, after the policy decided and its transitions (authorize, or
request approval) appended their events: one INSERT of the row as those transitions left it,
with the authorized call's outbox message in the same statement, where the call used to be
inserted as proposed, then UPDATEd by its transition, and its message inserted on its own
(three statements). `created_at` is taken before the events, as the INSERT used to give it.
The events appended by then (proposed, and the policy's transition) go in the same statement
too, rather than in the event batch's own INSERT at the block's end.
tests/test_toolcalls_sql_propose.py proves the reads and the rows are the ORM's, and the
events and rows those of the path written step by step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from runs import dbvalues, events
from runs import sql as runs_sql
from runs.models import OutboxMessage
from toolcalls.models import ToolCall
from toolcalls.sql import _CALL, _INSERT_CALL, call_values, calls_in_run

# The run's id reaches the count through a sub-select (`(SELECT CAST(%s AS varchar))`): the
# planner cannot see it, so each plan's estimate is the average run's. Seen: a run of few calls
# beside runs of hundreds made every custom plan cheaper than the generic one, so PostgreSQL
# planned the prepared statement again on every proposal (0.4 ms of its CPU each;
# pg_stat_statements' `plans` = `calls`), for the same index-only scan.
_TALLY = (
    "SELECT (SELECT count(*) FROM toolcalls_toolcall"
    " WHERE run_id = (SELECT CAST(%s AS varchar))) AS calls,"
    " (SELECT id FROM approvals_policy WHERE tenant_id = %s AND capability_id = %s"
    " ORDER BY version DESC LIMIT 1) AS policy_id, h.id, h.seq, h.hash"
    " FROM (SELECT 1) AS one LEFT JOIN (SELECT id, seq, hash FROM runs_event"
    " WHERE run_id = %s ORDER BY seq DESC LIMIT 1) AS h ON true"
)
_MESSAGE = OutboxMessage._meta.concrete_fields
_INSERT_MESSAGE = (
    f"INSERT INTO {OutboxMessage._meta.db_table} ({', '.join(f.column for f in _MESSAGE)})"
    f" VALUES ({', '.join(['%s'] * len(_MESSAGE))})"
)
_CREATED_AT = next(i for i, f in enumerate(_CALL) if f.name == "created_at")
# Columns that every save writes anew (updated_at).
_AUTO_NOW = [f for f in _CALL if getattr(f, "auto_now", False)]


@dataclass(frozen=True)
class RunTally:
    calls: int  # the run's tool calls (before this one)
    newest_policy_id: int | None  # approvals.sql.newest_policy_id of the capability
    head_read: bool  # False: `head` was not read (SQLite), the events read it themselves
    head: dict[str, Any] | None = None  # the run's last event (id, seq, hash); None: none yet


def run_tally(*, run_id: str, tenant_id: int, capability_id: str) -> RunTally:
    """For a run this transaction has locked: its calls, its chain head, the newest policy."""
    conn = connections[DEFAULT_DB_ALIAS]  # once: each `connection.…` looks it up again
    if conn.vendor != "postgresql":
        return RunTally(calls_in_run(run_id), None, head_read=False)
    cursor = runs_sql.cursor_for(conn, _TALLY)
    cursor.execute(_TALLY, [run_id, tenant_id, capability_id, run_id])
    calls, policy_id, *last = cursor.fetchone()
    head = None if last[0] is None else dict(zip(("id", "seq", "hash"), last, strict=True))
    return RunTally(calls, policy_id, head_read=True, head=head)


def insert_decided(call: ToolCall, *, created_at: datetime, message: OutboxMessage | None) -> None:
    """INSERT the new call as `save(force_insert=True)` would write it now, but for
    `created_at`, and the not yet written outbox `message` (if any) as outbox.enqueue would,
    in one statement. Inside `transitions.saved_once(call)`, whose save at the block's end then
    finds nothing to write; `call_written(call)` after that block."""
    conn = connections[DEFAULT_DB_ALIAS]  # once: each `connection.…` looks it up again
    values = call_values(call, conn)
    call.created_at = created_at
    values[_CREATED_AT] = dbvalues.plan(ToolCall, conn).param(_CREATED_AT, created_at)
    if conn.vendor != "postgresql":  # no INSERT in a WITH
        with conn.cursor() as cursor:
            cursor.execute(_INSERT_CALL, values)
        if message is not None:
            runs_sql.insert_rows([message])
    else:
        _insert_together(conn, values, message)
    call._state.adding, call._state.db = False, conn.alias
    # Everything is written; updated_at, which a save always writes, is remembered after the
    # block (call_written), so that the block's end has no column to save.
    # (`_remember_all` less those: a new call has nothing remembered yet, and the loop of
    # `_remember` over its 28 other columns was 1.7 % of a proposal under cProfile.)
    call._remember_all()
    for field in _AUTO_NOW:
        del call.__dict__["_saved_values"][field.attname]


def _insert_together(conn: Any, values: list[Any], message: OutboxMessage | None) -> None:
    """The call, its message and the events its block appended so far (the proposed event and
    the policy's transition's) in one statement: each part but the last a data-modifying WITH,
    which runs to completion whether or not the statement reads it. The events were the
    proposal's fifth statement (a round trip, psycopg's ~0.15 ms per statement, the server's)."""
    parts, params = [_INSERT_CALL], list(values)
    if message is not None:
        # As runs/sql.py's insert_rows prepares it (runs/dbvalues.py), not field by field.
        plan = dbvalues.plan(OutboxMessage, conn)
        parts.append(_INSERT_MESSAGE)
        params += plan.params(message, plan.every, True)
    pending = events.batch_take_pending(conn)
    if pending:
        events_insert, rows = runs_sql.events_insert(pending, conn)
        parts.append(events_insert)
        params.append(rows)
    statement = _together(tuple(parts))
    runs_sql.cursor_for(conn, statement).execute(statement, params)
    if message is not None:
        message._state.adding, message._state.db = False, conn.alias
    runs_sql.events_saved(pending)


# The statements made of parts (two or three kinds per proposal), each made once: the same
# text object each time, so psycopg keeps its adapters for it (runs/cursors.py cursor_for).
_TOGETHER: dict[tuple[str, ...], str] = {}


def _together(parts: tuple[str, ...]) -> str:
    statement = _TOGETHER.get(parts)
    if statement is None:
        statement = parts[-1]
        if len(parts) > 1:  # no part reads another: the names only label them
            withs = ", ".join(f"w{i} AS ({part})" for i, part in enumerate(parts[:-1]))
            statement = f"WITH {withs} {statement}"
        _TOGETHER[parts] = statement
    return statement


def call_written(call: ToolCall) -> None:
    """After `saved_once`'s block: the call knows every column it was written with, as
    toolcalls.sql.call_inserted leaves a call (its next transition saves what it changes)."""
    call._remember(_AUTO_NOW)
