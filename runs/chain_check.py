"""`verify_event_chain` over the whole log in constant memory, at the speed of hashing.

The log is read by (run, seq) through a server-side cursor, as plain tuples: timestamps come
formatted as `runs.events.compute_hash` formats them, payloads as text loaded one by one (a
payload that cannot be loaded is one problem, not the end of the check). Only the current
run's last (seq, hash) is kept.

Each event's hash is first computed over sorted, compact JSON (orjson), which is RFC 8785
for almost every payload (no floats, no keys outside the Basic Multilingual Plane). A match
proves the event intact: equal bytes to what was hashed when it was written mean equal
content (orjson reads an integer past 64 bits as a float, but writes such floats with an
exponent RFC 8785 never writes that way). A mismatch proves nothing by itself, so that event
is loaded with the standard library and hashed with RFC 8785 (`runs.events.hash_body`), and
only that verdict is reported: the result is `runs.events.verify_chain`'s, with the
canonicaliser run only where it has to be.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from hashlib import sha256
from typing import Any

import orjson
from django.db import connection, transaction

from runs.events import GENESIS_HASH, hash_body
from runs.prefetch import prefetched

_ISO = '\'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"\''
SELECT = (
    "SELECT id, run_id, seq, event_type, schema_version, producer, tenant_id, actor, turn_id,"
    " decision_id, capability_id, tool_call_id, approval_id, correlation_id, causation_id,"
    f" to_char(occurred_at AT TIME ZONE 'UTC', {_ISO}),"
    f" to_char(recorded_at AT TIME ZONE 'UTC', {_ISO}),"
    " payload::text, prev_hash, hash FROM runs_event ORDER BY run_id, seq"
)
FETCH = 5000

# Sorted keys, no whitespace, UTF-8 as is: RFC 8785 but for floats and key order beyond the
# BMP, where the hash then differs and the exact canonicaliser decides. orjson, because
# loading and writing JSON is most of the work left once rows are plain tuples.
_SORTED = orjson.OPT_SORT_KEYS


def _rows() -> Iterator[tuple]:
    # A named (server-side) cursor streams rows in FETCH-sized batches instead of the
    # driver holding the whole result; it lives in a transaction (PostgreSQL's rule).
    # The next FETCH rows are fetched while these are hashed (runs/prefetch.py).
    with transaction.atomic(), connection.chunked_cursor() as cursor:
        cursor.execute(SELECT)
        with closing(prefetched(cursor.fetchmany, FETCH)) as batches:
            for batch in batches:
                yield from batch


def verify_log() -> tuple[list[str], int]:
    """(one line per problem, how many events were read)."""
    problems: list[str] = []
    run, expected_seq, expected_prev = None, 0, GENESIS_HASH
    count = 0
    for row in _rows():
        count += 1
        event_id, run_id, seq, prev_hash, stored_hash = row[0], row[1], row[2], row[18], row[19]
        if run_id != run:
            run, expected_seq, expected_prev = run_id, 0, GENESIS_HASH
        where = f"{run_id}#{seq} ({event_id})"
        if seq != expected_seq + 1:
            problems.append(f"{where}: sequence gap, expected #{expected_seq + 1}")
        if prev_hash != expected_prev:
            problems.append(f"{where}: prev_hash does not match the previous event's hash")
        if problem := _content_problem(row):
            problems.append(f"{where}: {problem}")
        expected_seq, expected_prev = seq, stored_hash
    return problems, count


def _content_problem(row: tuple) -> str | None:
    try:
        if (
            sha256(orjson.dumps(_body(row, orjson.loads(row[17])), option=_SORTED)).hexdigest()
            == row[19]
        ):
            return None
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        pass  # a number orjson reads or writes otherwise: the exact path below decides
    # The exact path, as runs.events.verify_chain takes it: the standard library loads the
    # payload (orjson reads a 301-digit integer as a float), RFC 8785 hashes it.
    try:
        payload = json.loads(row[17])
    except ValueError as exc:
        return f"payload cannot be loaded ({_brief(exc)})"
    try:
        actual = hash_body(_body(row, payload))
    except (ValueError, TypeError, RecursionError) as exc:
        return f"payload cannot be canonicalised, its hash cannot be checked ({_brief(exc)})"
    if actual != row[19]:
        return "content does not match its hash (changed after writing)"
    return None


def _body(row: tuple, payload: Any) -> dict[str, Any]:
    # The fields and names of runs.events.compute_hash, in its order.
    return {
        "id": row[0],
        "run": row[1],
        "seq": row[2],
        "type": row[3],
        "schema_version": row[4],
        "producer": row[5],
        "tenant": row[6],
        "actor": row[7],
        "turn_id": row[8],
        "decision_id": row[9],
        "capability_id": row[10],
        "tool_call_id": row[11],
        "approval_id": row[12],
        "correlation_id": row[13],
        "causation_id": row[14],
        "occurred_at": row[15],
        "recorded_at": row[16],
        "payload": payload,
        "prev_hash": row[18],
    }


def _brief(error: Exception) -> str:
    message = str(error)
    return f"{type(error).__name__}: {message[:80]}{'…' if len(message) > 80 else ''}"
