"""The record step's writes: what an accepted call leaves besides its own row and its events.

Recording an answer ends the attempt, keeps the receipt, moves the object's revision on and
writes the verification's outbox message. A dispatch batch did each with its own ORM
statement per call; here they are gathered (`RecordWrites`) while the calls are recorded and
written when the record ends, one statement of each kind for the whole batch
(toolcalls/sql.py, runs/sql.py). The single path records with the same code, for a batch of
one. Everything is still written in the record's transaction, with the call's events.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from django.utils import timezone

from runs import dbvalues, outbox
from runs import sql as runs_sql
from runs.models import OutboxMessage
from toolcalls import gate, sql
from toolcalls.capabilities import Capability
from toolcalls.models import Receipt, ToolCall
from toolcalls.send import Outcome
from toolcalls.writes import VERIFY_TASK, tool_call_transition


class RecordWrites:
    """The writes of one record transaction, in the order `flush` writes them. Nothing in the
    transaction may read them back before `flush` (a count of attempts flushes the attempts'
    ends first: `flush_attempt_ends`)."""

    def __init__(self) -> None:
        self.attempt_ends: list[sql.AttemptEnd] = []
        self.receipts: list[Receipt] = []
        self.writes: list[tuple[ToolCall, str]] = []  # completed writes: (call, actor)
        self.messages: dict[bool, list[OutboxMessage]] = {True: [], False: []}

    def end_attempt(
        self, attempt_id: str, classification: str, now: datetime, outcome: Outcome
    ) -> None:
        self.attempt_ends.append(
            sql.AttemptEnd(attempt_id, classification, now, outcome.error_name, outcome.http_status)
        )

    def flush_attempt_ends(self) -> None:
        """Before anything counts attempts by how they ended (a retry's count, the breaker)."""
        ends, self.attempt_ends = self.attempt_ends, []
        sql.end_attempts(ends)

    def verified_already(self, message_ids: set[str]) -> None:
        """These verification messages are written done: their calls' verifications are
        judged in this transaction (a batch that observed before it recorded)."""
        done_at = timezone.now()
        for message in self.messages[False]:
            if message.id in message_ids:
                message.done_at = done_at

    def flush(self) -> None:
        self.flush_attempt_ends()
        receipts, self.receipts = self.receipts, []
        runs_sql.insert_rows(receipts)
        for publish_now, messages in self.messages.items():
            if messages:
                outbox.enqueue_many(messages, publish_now=publish_now)
        self.messages = {True: [], False: []}
        writes, self.writes = self.writes, []
        moved = sql.bump_revisions(Counter((c.tenant_id, c.object_ref) for c, _ in writes))
        for call, actor in writes:
            if (call.tenant_id, call.object_ref) in moved:
                # The object changed: calls computed from its old revision must not run.
                gate.approvals_invalidate_for_object(
                    call=call, object_ref=call.object_ref, actor=actor
                )


def tool_call_accept(
    *,
    call: ToolCall,
    capability: Capability,
    body: dict[str, Any],
    source: str,
    status: str,
    actor: str,
    attempt_id: str | None = None,
    evidence: str = "",
    verify_here: bool = False,
    writes: RecordWrites | None = None,
) -> str | None:
    """The system did this operation (by our dispatch, a look-up or a person's word): keep
    its receipt, complete, and start verification. With `verify_here` the caller verifies
    right after commit (the returned outbox message id is the safety net); otherwise a
    verification task is queued. The call is locked. The receipt, the revision and the
    message are written with `writes` when its caller flushes it; without, before returning."""
    own = writes is None
    writes = writes or RecordWrites()
    producer = "dispatcher" if source == Receipt.Source.DISPATCH else "reconciler"
    external_id = external_id_of(capability, body)
    # Receipt(...) less Model.__init__'s loop (runs/dbvalues.py): one per accepted call.
    receipt = dbvalues.new(
        Receipt,
        {
            "tool_call": call,
            "attempt_id": attempt_id,
            "external_id": external_id,
            "status": status,
            "source": source,
            "raw_response": body,
        },
    )
    writes.receipts.append(receipt)
    call.external_id, call.result = external_id, body
    tool_call_transition(
        call,
        "accept",
        actor=actor,
        producer=producer,
        receipt_id=receipt.id,
        external_id=external_id,
        receipt_status=status,
        source=source,
        evidence=evidence,
    )
    if capability.completes_on_response:
        tool_call_transition(call, "complete", actor=actor, producer=producer)
        if capability.kind == "write":
            writes.writes.append((call, actor))
    message_id = _start_verification(call, capability, writes, actor, producer, verify_here)
    if own:
        writes.flush()
    return message_id


def external_id_of(capability: Capability, body: dict[str, Any]) -> str:
    """The operation's id at the external system, from its answer."""
    return str(body.get(capability.external_id_field, ""))


def _start_verification(
    call: ToolCall,
    capability: Capability,
    writes: RecordWrites,
    actor: str,
    producer: str,
    verify_here: bool,
) -> str | None:
    if capability.verify is None:
        tool_call_transition(
            call,
            "confirm_success",
            actor=actor,
            producer=producer,
            reason="a read observes the system itself",
        )
        return None
    tool_call_transition(call, "await_verification", actor=actor, producer=producer)
    message = outbox.build(VERIFY_TASK, call.id)
    writes.messages[not verify_here].append(message)
    return message.id if verify_here else None
