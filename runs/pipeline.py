"""Writes sent together: inside `writes_together()`, the statements written through `write`
whose results nobody reads (a transition's UPDATE, an event batch's INSERT, an outbox
message, a counter) are queued, and sent in one round trip (psycopg's pipeline mode) when the
block ends, or with the next other statement of the connection, ahead of it, so the database
sees them in the order the code wrote them and every read sees them. Each one's row count is
checked once the results are in. (No statement in a block may use COPY or a server-side
cursor, `QuerySet.iterator()`, while writes are queued: psycopg refuses both in a pipeline.)

Why: the approver's click waits for each round trip of its transaction, and on a busy host
each one waits for a core twice (the web process and its backend are woken in turn): the
decision's six writes after its reads were six such waits (issue 12, `bench_approve --load
dispatch`). The statements, their order and their transaction are unchanged: only how many
times the process waits for the server.

Outside a block, or on another database than PostgreSQL, `write` runs the statement at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from runs.cursors import cursor_for

# (statement, parameters, the rows it must change or None, the error's words if it did not)
Queued = tuple[str, list[Any], "int | None", str]


def write(
    conn: Any, statement: str, params: list[Any], *, rows: int | None = None, error: str = ""
) -> None:
    """Run `statement`, now or with the block's other writes; a row count other than `rows`
    (when given) raises DatabaseError(`error`)."""
    queued = getattr(conn, "_queued_writes", None)
    if queued is not None:
        queued.append((statement, params, rows, error))
        return
    cursor = cursor_for(conn, statement)
    cursor.execute(statement, params)
    _check(cursor.rowcount, rows, error)


@contextlib.contextmanager
def writes_together() -> Iterator[None]:
    """Inside a transaction: the block's `write`s in one round trip (nested blocks join the
    outer one). A statement run any other way in the block takes the queued writes with it,
    ahead of it, in its round trip, so it reads what they wrote; an exception leaving the
    block sends them too (as they would have run already without the block; the transaction
    decides what stays). A queued write that fails marks the transaction for rollback, since
    its error may be raised where no handler expects it (`_send`)."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql" or getattr(conn, "_queued_writes", None) is not None:
        yield
        return
    if not conn.in_atomic_block:
        raise RuntimeError("writes are sent together inside a transaction")
    conn._queued_writes = []

    def send_first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not conn._queued_writes:
            return execute(sql, params, many, context)
        # The queued writes, then this statement, in the same round trip.
        return _send(conn, lambda: execute(sql, params, many, context))

    try:
        with conn.execute_wrapper(send_first):
            try:
                yield
            except BaseException:
                # The transaction is failing or being abandoned: a write the server refuses
                # now must not hide the error that left the block.
                if conn._queued_writes:
                    with contextlib.suppress(DatabaseError):
                        _send(conn)
                raise
            # Not when the last statement took them: an empty pipeline is still a round trip
            # (its Sync).
            if conn._queued_writes:
                _send(conn)
    finally:
        conn._queued_writes = None


def _send(conn: Any, then: Callable[[], Any] | None = None) -> Any:
    """The queued writes, and `then` (the statement that found them queued) after them, in
    one round trip; `then`'s result."""
    queued, conn._queued_writes = conn._queued_writes, None  # the sending is not queued
    try:
        if len(queued) == 1 and then is None:
            statement, params, rows, error = queued[0]
            write(conn, statement, params, rows=rows, error=error)
            return None
        sent = []
        # One Sync: the results come back together. An error is raised when the block ends,
        # as Django's (IntegrityError, …) as if the statement had run alone.
        with conn.wrap_database_errors, conn.connection.pipeline():
            for statement, params, rows, error in queued:
                cursor = conn.cursor()  # one per statement: each keeps its row count
                cursor.execute(statement, params)
                sent.append((cursor, rows, error))
            result = then() if then is not None else None
        for cursor, rows, error in sent:
            _check(cursor.rowcount, rows, error)
            cursor.close()
        return result
    except BaseException:
        # A queued write's error is raised at a later statement, maybe at the SAVEPOINT of a
        # block the write was not in, whose handler would carry on: to a COMMIT that the
        # server turns into a rollback (after on_commit's callbacks ran), or past a row count
        # that failed. So the transaction is marked to roll back; an exception leaving a
        # savepoint's block still rolls back just that savepoint, as Django does. (The error
        # of `then` itself marks it too, and a failed RELEASE cannot be undone by rolling
        # back to its savepoint: both fail closed.)
        conn.needs_rollback = True
        raise
    finally:
        conn._queued_writes = []


def _check(count: int, rows: int | None, error: str) -> None:
    if rows is not None and count != rows:
        raise DatabaseError(error or f"the write changed {count} rows, not {rows}")


def sending_together(alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether the connection is sending statements in one round trip right now (for the
    benchmark's and the tests' statement counters)."""
    conn = connections[alias].connection
    return conn is not None and bool(conn.pgconn.pipeline_status)
