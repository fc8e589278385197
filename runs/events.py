"""The event registry and the one function that appends to the log.

Every event type is registered with a JSON Schema per schema version. `append` validates the
payload, takes the next sequence number of the run under a row lock, chains the hash of the
run's previous event, and inserts, all inside the caller's transaction: the event commits
with the state change it describes or not at all.

Old versions stay readable: an upcaster turns a payload of version N into version N + 1, and
`upcast` applies them in turn, so a log written long ago still replays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha256
from typing import Any

import jsonschema
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from runs import dbvalues, schema_check, sql
from runs.canonical import canonical_json, canonical_json_around
from runs.models import Event, Run
from runs.roundtrip import payload_roundtrip

GENESIS_HASH = "0" * 64

_SCHEMAS: dict[tuple[str, int], dict[str, Any]] = {}
_VALIDATORS: dict[tuple[str, int], jsonschema.Draft202012Validator] = {}
_LATEST: dict[str, int] = {}
# A quick "valid" for simple schemas (runs/schema_check.py); jsonschema decides the rest.
_QUICK: dict[tuple[str, int], schema_check.Check | None] = {}
_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


class EventSchemaError(ValueError):
    """An event of an unknown type or version, or a payload its schema rejects."""


def register(event_type: str, version: int, schema: dict[str, Any]) -> None:
    key = (event_type, version)
    if key in _SCHEMAS and _SCHEMAS[key] != schema:
        raise ValueError(f"{event_type} v{version} is already registered with another schema")
    jsonschema.Draft202012Validator.check_schema(schema)
    _SCHEMAS[key] = schema
    _VALIDATORS[key] = jsonschema.Draft202012Validator(schema)
    _QUICK[key] = schema_check.compile_schema(schema)
    _LATEST[event_type] = max(version, _LATEST.get(event_type, 0))


def register_upcaster(
    event_type: str, from_version: int, upcaster: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    _UPCASTERS[(event_type, from_version)] = upcaster


def registered_types() -> dict[str, int]:
    return dict(_LATEST)


def latest_version(event_type: str) -> int:
    try:
        return _LATEST[event_type]
    except KeyError:
        raise EventSchemaError(f"unknown event type {event_type!r}") from None


def validate(event_type: str, version: int, payload: dict[str, Any]) -> None:
    validator = _VALIDATORS.get((event_type, version))
    if validator is None:
        raise EventSchemaError(f"unknown event type {event_type!r} version {version}")
    quick = _QUICK[(event_type, version)]
    if quick is not None and quick(payload):
        return
    errors = sorted(validator.iter_errors(payload), key=lambda e: list(e.absolute_path))
    if errors:
        problems = "; ".join(
            f"{'/'.join(map(str, e.absolute_path)) or '(payload)'}: {e.message}" for e in errors
        )
        raise EventSchemaError(f"{event_type} v{version} payload rejected: {problems}")


def upcast(event_type: str, version: int, payload: dict[str, Any]) -> tuple[int, dict]:
    """Bring a stored payload up to the latest version of its type."""
    latest = latest_version(event_type)
    while version < latest:
        step = _UPCASTERS.get((event_type, version))
        if step is None:
            raise EventSchemaError(f"no upcaster for {event_type} v{version}")
        payload = step(payload)
        version += 1
    return version, payload


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def compute_hash(event: Event, encoded_payload: bytes | None = None) -> str:
    """The hash of everything an event says, chained to the run's previous event.
    `encoded_payload`: the canonical JSON of `event.payload`, when the caller has it."""
    if encoded_payload is None:
        return hash_body(event_body(event))
    return sha256(canonical_json_around(event_body(event), "payload", encoded_payload)).hexdigest()


def event_body(event: Event) -> dict[str, Any]:
    """What an event's hash covers (bench/pages_seed.py clones its canonical form)."""
    try:
        # From the row's values: `run_id` and `tenant_id` are foreign keys, whose descriptor
        # is a call per read.
        return _body(event.__dict__)
    except KeyError:  # a deferred field: its descriptor loads it
        return _body({name: getattr(event, name) for name in BODY_ATTNAMES})


# The columns an event's hash covers, in its body's order (bench/pages_seed.py reads them).
BODY_ATTNAMES = (
    "id",
    "run_id",
    "seq",
    "event_type",
    "schema_version",
    "producer",
    "tenant_id",
    "actor",
    "turn_id",
    "decision_id",
    "capability_id",
    "tool_call_id",
    "approval_id",
    "correlation_id",
    "causation_id",
    "occurred_at",
    "recorded_at",
    "payload",
    "prev_hash",
)


def _body(values: dict[str, Any]) -> dict[str, Any]:
    occurred_at, recorded_at = values["occurred_at"], values["recorded_at"]
    occurred = iso(occurred_at)
    return {
        "id": values["id"],
        "run": values["run_id"],
        "seq": values["seq"],
        "type": values["event_type"],
        "schema_version": values["schema_version"],
        "producer": values["producer"],
        "tenant": values["tenant_id"],
        "actor": values["actor"],
        "turn_id": values["turn_id"],
        "decision_id": values["decision_id"],
        "capability_id": values["capability_id"],
        "tool_call_id": values["tool_call_id"],
        "approval_id": values["approval_id"],
        "correlation_id": values["correlation_id"],
        "causation_id": values["causation_id"],
        "occurred_at": occurred,
        # One clock reading for both (`append(at=...)`): written out once.
        "recorded_at": occurred if recorded_at is occurred_at else iso(recorded_at),
        "payload": values["payload"],
        "prev_hash": values["prev_hash"],
    }


def hash_body(body: dict[str, Any]) -> str:
    """SHA-256 of the RFC 8785 form of an event's body (runs/chain_check.py checks with it)."""
    return sha256(canonical_json(body)).hexdigest()


@dataclass(frozen=True)
class Ids:
    """The ids of DESIGN section 1 that an event may carry besides its run."""

    turn_id: str = ""
    decision_id: str = ""
    capability_id: str = ""
    tool_call_id: str = ""
    approval_id: str = ""
    causation_id: str = ""


NO_IDS = Ids()


# long: one event made whole in one place (ids, clock, chain head, payload, hash), as a batch
# appends it; the steps are each a line or two.
def append(
    *,
    run: Run,
    event_type: str,
    payload: dict[str, Any],
    producer: str,
    actor: str = "",
    ids: Ids = NO_IDS,
    occurred_at: datetime | None = None,
    at: datetime | None = None,
) -> Event:
    """Append one event to the run's log, inside the caller's transaction (inside a `batch`,
    the INSERT waits for the end of the batch). `at`: the clock as the caller just read it
    (a transition's moment, kept on its row), the event's occurred_at and recorded_at both."""
    current = getattr(_local, "batch", None)
    # A batch keeps its connection: each `connections[…]` is a look-up in asgiref's Local.
    conn = connections[DEFAULT_DB_ALIAS] if current is None else current.conn
    if not conn.in_atomic_block:
        raise RuntimeError("events are appended inside the transaction of their state change")
    version = latest_version(event_type)
    validate(event_type, version, payload)
    if current is not None:
        _check_savepoints(current, conn)
    run_id = run.id  # not `.pk`: a property and a getattr per read
    last, previous_of_call = (current or _Batch(conn)).head(run_id, ids.tool_call_id)
    # A tool call's events are caused by its previous event (the claim by the authorization,
    # the receipt by the claim), unless the caller names another cause.
    causation_id = ids.causation_id or previous_of_call
    now = at or timezone.now()
    # A JSON round trip now gives the hash the same payload that the database returns.
    stored, encoded = payload_roundtrip(payload)
    # Made as Event(...) makes it, without its constructor's per-field loop (runs/dbvalues.py).
    event = dbvalues.new(
        Event,
        dict(
            run_id=run_id,
            seq=(last["seq"] + 1) if last else 1,
            event_type=event_type,
            schema_version=version,
            producer=producer,
            tenant_id=run.tenant_id,
            actor=actor,
            turn_id=ids.turn_id,
            decision_id=ids.decision_id,
            capability_id=ids.capability_id,
            tool_call_id=ids.tool_call_id,
            approval_id=ids.approval_id,
            correlation_id=run.correlation_id,
            causation_id=causation_id,
            occurred_at=occurred_at or now,
            recorded_at=now,
            payload=stored,
            prev_hash=last["hash"] if last else GENESIS_HASH,
        ),
    )
    event.hash = compute_hash(event, encoded)
    if current is None:
        sql.insert_events([event])
    else:
        current.add(event)
    return event


class _Batch:
    """The events of one block of a transaction: each run's chain head is read (and the run
    locked) once, the events are inserted together when the block ends."""

    def __init__(
        self, conn: Any, calls: dict[str, str] | None = None, held: Collection[str] = ()
    ) -> None:
        self.conn = conn
        self.savepoints = list(conn.savepoint_ids)
        # Runs whose lock the transaction took before the block (`batch(held=...)`).
        self.held = frozenset(held)
        self.heads: dict[str, dict[str, Any] | None] = {}
        self.last_of_call: dict[str, str] = {}
        self.pending: list[Event] = []
        # run id -> the tool calls whose events the block expects to append in that run
        self.expected: dict[str, list[str]] = {}
        for tool_call_id, run_id in (calls or {}).items():
            self.expected.setdefault(run_id, []).append(tool_call_id)

    def head(self, run_id: str, tool_call_id: str) -> tuple[dict[str, Any] | None, str]:
        if run_id not in self.heads and not self._lock_expected(run_id):
            self._lock_one(run_id, tool_call_id)
        if tool_call_id and tool_call_id not in self.last_of_call:
            self.last_of_call[tool_call_id] = sql.last_event_of_call(tool_call_id)
        return self.heads[run_id], self.last_of_call.get(tool_call_id, "")

    def _lock_one(self, run_id: str, tool_call_id: str) -> None:
        last, previous = sql.lock_and_read_head(run_id, tool_call_id, held=run_id in self.held)
        self.heads[run_id] = last
        if tool_call_id:
            self.last_of_call[tool_call_id] = previous
        self._read_calls_of([run_id], tool_call_id)

    def _lock_expected(self, run_id: str) -> bool:
        """The expected runs not held yet, from `run_id` on, locked and read together (3
        statements for the batch rather than 2 or 3 per run: with a run per call, 5 of a
        dispatched call's 42 statements). False (nothing done) where one run's path is as
        cheap: fewer than two of them, or no row locks to take in one statement."""
        waiting = [run for run in self.expected if run not in self.heads]
        if run_id not in waiting or len(waiting) < 2 or self.conn.vendor != "postgresql":
            return False
        heads = sql.lock_and_read_heads(waiting, run_id)
        if run_id not in heads:
            raise Run.DoesNotExist(run_id)
        self.heads.update(heads)
        self._read_calls_of(list(heads), "")
        return True

    def _read_calls_of(self, run_ids: list[str], known: str) -> None:
        # The runs are locked now: one read for their calls' last events, rather than one per
        # call when each appends its first event.
        calls = [c for run in run_ids for c in self.expected.get(run, ()) if c != known]
        if calls:
            found = sql.last_events_of_calls(calls)
            self.last_of_call.update({c: found.get(c, "") for c in calls})

    def add(self, event: Event) -> None:
        self.heads[event.run_id] = {"id": event.id, "seq": event.seq, "hash": event.hash}
        if event.tool_call_id:
            self.last_of_call[event.tool_call_id] = event.id
        self.pending.append(event)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        sql.insert_events(pending)


_local = threading.local()


def _batch_here(conn: Any = None) -> _Batch | None:
    current = getattr(_local, "batch", None)
    if current is not None:
        # Not the `connection` proxy: it looks the connection up on each read.
        _check_savepoints(current, conn if conn is not None else connections[DEFAULT_DB_ALIAS])
    return current


def _check_savepoints(current: _Batch, conn: Any) -> None:
    if conn.savepoint_ids != current.savepoints:
        # What a savepoint appends must roll back with it, and what the batch holds must
        # not: neither is possible once the batch's INSERT waits for the end of the block.
        raise RuntimeError("no event is appended inside a savepoint opened in an event batch")


def in_batch() -> bool:
    """Whether an event batch is open in this thread: then a transaction is (`batch` opens
    only inside one, and closes before it ends)."""
    return getattr(_local, "batch", None) is not None


@contextmanager
def batch(calls: dict[str, str] | None = None, *, held: Collection[str] = ()) -> Iterator[None]:
    """Inside a transaction: the block's events share one chain-head read per run and one
    INSERT, written when the block ends (nested blocks join the outer one). Nothing in the
    block may read the events back from the database before then. `calls` (tool call id ->
    run id) names the calls the block expects to write about: the last events of a run's
    calls are read together, when the run is locked. `held`: runs that the transaction has
    locked FOR UPDATE already (the approver's decision locks its run with the approval): their
    chain heads are read without locking them again."""
    if getattr(_local, "batch", None) is not None:
        yield
        return
    conn = connections[DEFAULT_DB_ALIAS]  # once: each `connection.…` looks it up again
    if not conn.in_atomic_block:
        raise RuntimeError("a batch of events is written inside a transaction")
    _local.batch = _Batch(conn, calls, held)
    try:
        yield
        _local.batch.flush()
    finally:
        _local.batch = None


def batch_knows_head(
    run_id: str,
    last: dict[str, Any] | None,
    new_calls: list[str],
    last_of_calls: dict[str, str] | None = None,
) -> None:
    """Inside a batch, from a caller that locked the run in this transaction and read its last
    event after the lock (`last`: id, seq, hash; None when it has none), in the same
    statement as other reads it needed (toolcalls/sql.py run_tally, approvals/sql.py
    record_decision): the batch takes that head instead of locking and reading again.
    `new_calls` were created in this transaction and have no event yet; `last_of_calls` (call
    id -> the id of its last event, '' when none) were read with the head. Outside a batch,
    or once the batch holds the run, nothing changes."""
    current = _batch_here()
    if current is None or run_id in current.heads:
        return
    current.heads[run_id] = last
    current.last_of_call.update(dict.fromkeys(new_calls, ""))
    current.last_of_call.update(last_of_calls or {})


def batch_take_pending(conn: Any = None) -> list[Event]:
    """Inside a batch: its events not written yet, handed to a caller whose own statement
    writes them now (toolcalls/sql_propose.py: the proposal's call, its dispatch message and
    its events in one INSERT); the batch keeps their chain heads and writes only the events
    appended after this at its end. Outside a batch: none. `conn`: the default database's
    connection, when the caller has it."""
    current = _batch_here(conn)
    if current is None:
        return []
    pending, current.pending = current.pending, []
    return pending


def batch_holds_run(run_id: str) -> bool:
    """Whether this block's batch holds the run's lock (it locked the run and read its head,
    was told so by `batch_knows_head`, or was opened with the run `held`): a statement on the
    run cannot wait for the lock."""
    current = _batch_here()
    return current is not None and (run_id in current.heads or run_id in current.held)


class UnreadablePayload:
    """Stands for a stored payload that could not even be loaded (verify_event_chain reads
    payloads itself, so that one such row does not end the check)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def verify_chain(events: list[Event] | Any) -> list[str]:
    """Check each event's hash and its link to the previous one; events ordered by run, seq.

    Every event is checked, whatever came before it: a payload that cannot be loaded or
    canonicalised any more is one problem, and the next event's link is still checked
    against the hash stored on it."""
    problems: list[str] = []
    previous: dict[str, tuple[int, str]] = {}
    for event in events:
        expected_seq, expected_prev = previous.get(event.run_id, (0, GENESIS_HASH))
        where = f"{event.run_id}#{event.seq} ({event.id})"
        if event.seq != expected_seq + 1:
            problems.append(f"{where}: sequence gap, expected #{expected_seq + 1}")
        if event.prev_hash != expected_prev:
            problems.append(f"{where}: prev_hash does not match the previous event's hash")
        if problem := _content_problem(event):
            problems.append(f"{where}: {problem}")
        previous[event.run_id] = (event.seq, event.hash)
    return problems


def _content_problem(event: Event) -> str | None:
    if isinstance(event.payload, UnreadablePayload):
        return f"payload cannot be loaded ({_brief(event.payload.error)})"
    try:
        actual = compute_hash(event)
    except (ValueError, TypeError, RecursionError) as exc:
        # rfc8785 refuses what it cannot carry (an integer past 2**53, a non-finite float):
        # the payload was changed after writing, or written by a version that let it in.
        return f"payload cannot be canonicalised, its hash cannot be checked ({_brief(exc)})"
    if actual != event.hash:
        return "content does not match its hash (changed after writing)"
    return None


def _brief(error: Exception) -> str:
    message = str(error)
    return f"{type(error).__name__}: {message[:80]}{'…' if len(message) > 80 else ''}"
