"""The proposal's hand-written SQL (toolcalls/sql.py) reads and writes what the ORM did: the
same run, key holder and open calls on the object, the same locked run, the same call row;
and a proposal through it writes the same events, chained, in fewer statements."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Policy
from runs import events, outbox, transitions
from runs.events import verify_chain
from runs.models import Event, OutboxMessage, Run, Tenant
from runs.services import run_start
from tests.helpers import BIG_REFUND, REFUND, ApiClient, propose, propose_in, start_run
from tests.sandbox_process import Sandbox
from toolcalls import dispatch, lifecycle, sql, sql_propose
from toolcalls.models import ToolCall
from toolcalls.propose import tool_call_propose

pytestmark = pytest.mark.django_db

REF = "order:order-002"


def _values(obj: Any, *skip: str) -> dict[str, Any]:
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if f.attname not in skip
    }


def _set_status(call: ToolCall, execution: str, verification: str = "not_observed") -> None:
    # Protected state fields: a queryset update puts a call where a test needs it.
    ToolCall.objects.filter(pk=call.pk).update(
        execution_status=execution, verification_status=verification
    )


def _lookup(run: Run, key: str) -> sql.ProposalLookup | None:
    return sql.proposal_lookup(
        tenant_id=run.tenant_id,
        run_id=run.pk,
        key=key,
        capability_id="refund-order-v2",
        object_ref=REF,
    )


def test_the_lookup_reads_what_the_orm_reads(run: Run, sandbox: Sandbox) -> None:
    calls = [propose_in(run, {**REFUND, "amount_cents": n}, intent=f"i{n}") for n in (1, 2, 3, 4)]
    _set_status(calls[1], "completed", "confirmed_success")  # final: not open
    _set_status(calls[2], "completed", "pending")  # accepted there, not yet seen: open
    _set_status(calls[3], "failed")  # final: not open
    key = calls[0].idempotency_key

    found = _lookup(run, key)
    orm = sql._proposal_lookup_orm(run.tenant_id, run.pk, key, "refund-order-v2", REF)

    assert found == orm
    assert found.existing_call_id == calls[0].pk
    assert [c[0] for c in found.open_calls] == [calls[0].pk, calls[2].pk]
    assert found.open_calls[1][1] == {**REFUND, "amount_cents": 3}  # args as a dict
    assert (found.run_id, found.correlation_id) == (run.pk, run.correlation_id)


def test_the_lookup_of_a_new_key_finds_no_call_and_no_open_calls(run: Run) -> None:
    found = _lookup(run, "acme:order:order-002:refund:new")

    assert found == sql.ProposalLookup(run.pk, run.correlation_id, None, [])


def test_the_lookup_finds_no_run_of_another_tenant(run: Run, other_tenant: Tenant) -> None:
    theirs, _ = run_start(tenant=other_tenant, title="theirs", actor="test")

    assert _lookup(theirs, "k") is not None
    assert (
        sql.proposal_lookup(
            tenant_id=run.tenant_id, run_id=theirs.pk, key="k", capability_id="x", object_ref="y"
        )
        is None
    )


def test_the_run_lock_reads_what_the_orm_reads(run: Run, other_tenant: Tenant) -> None:
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = sql.lock_run(tenant_id=run.tenant_id, run_id=run.pk)
        theirs = sql.lock_run(tenant_id=other_tenant.pk, run_id=run.pk)

    assert queries[0]["sql"].endswith("FOR UPDATE")
    assert _values(locked) == _values(Run.objects.get(pk=run.pk))
    assert theirs is None


def test_the_run_lock_by_id_alone_reads_what_the_orm_reads(run: Run) -> None:
    """lifecycle.run_lock's (a worker's, a decision's): `Run.objects.select_for_update()
    .filter(pk=...).first()` written out."""
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = lifecycle.run_lock(run.pk)
        assert sql.lock_run(tenant_id=None, run_id="run_missing") is None

    assert len(queries) == 2 and queries[0]["sql"].endswith("FOR UPDATE")
    assert "tenant_id" not in queries[0]["sql"].split("WHERE")[1]
    assert _values(locked) == _values(Run.objects.get(pk=run.pk))


def test_the_run_tally_reads_what_the_orm_reads(run: Run, sandbox: Sandbox) -> None:
    def tally() -> sql_propose.RunTally:
        with transaction.atomic():
            sql.lock_run(tenant_id=run.tenant_id, run_id=run.pk)
            return sql_propose.run_tally(
                run_id=run.pk, tenant_id=run.tenant_id, capability_id="refund-order-v2"
            )

    def head() -> dict[str, Any] | None:
        last = Event.objects.filter(run=run).order_by("-seq").first()
        return None if last is None else {"id": last.id, "seq": last.seq, "hash": last.hash}

    first = tally()
    assert (first.calls, first.newest_policy_id, first.head) == (0, None, head())
    assert first.head_read and first.head is not None  # the run's start
    other = Run.objects.create(tenant=run.tenant, title="no events yet")
    with transaction.atomic():
        sql.lock_run(tenant_id=run.tenant_id, run_id=other.pk)
        bare = sql_propose.run_tally(run_id=other.pk, tenant_id=run.tenant_id, capability_id="x")
    assert (bare.calls, bare.newest_policy_id, bare.head) == (0, None, None)
    for n in (1, 2):
        propose_in(run, {**REFUND, "amount_cents": n}, intent=f"tally-{n}")
    Policy.objects.create(
        tenant=run.tenant, capability_id="refund-order-v2", version=2, rules=[], created_by="t"
    )
    Policy.objects.create(
        tenant=run.tenant, capability_id="other-capability", version=3, rules=[], created_by="t"
    )

    found = tally()
    newest = (
        Policy.objects.filter(tenant=run.tenant, capability_id="refund-order-v2")
        .order_by("-version")
        .first()
    )
    assert found.calls == ToolCall.objects.filter(run=run).count() == 2
    assert found.head == head() != first.head
    assert found.newest_policy_id == newest.pk
    assert newest.version == 2


def _new_call(run: Run, n: int) -> ToolCall:
    return ToolCall(
        tenant=run.tenant,
        run=run,
        capability_id="refund-order-v2",
        intent=f"i{n}",
        object_ref=REF,
        object_revision=3,
        args={**REFUND, "reason": "naïve \u2603"},
        args_digest="d" * 64,
        idempotency_key=f"key-{n}",
        external_request_id=f"req_{n}",
    )


@pytest.mark.parametrize("write", ["insert_call", "insert_decided"])
def test_the_call_insert_writes_the_row_the_orm_writes(run: Run, write: str) -> None:
    with transaction.atomic():
        ours, theirs = _new_call(run, 1), _new_call(run, 2)
        if write == "insert_call":
            sql.insert_call(ours)
        else:
            created_at = timezone.now()
            with transitions.saved_once(ours):
                sql_propose.insert_decided(ours, created_at=created_at, message=None)
            sql_propose.call_written(ours)
            assert ours.created_at == created_at
        theirs.save(force_insert=True)

    differ = (
        "id",
        "intent",
        "idempotency_key",
        "external_request_id",
        "created_at",
        "updated_at",
        "status_since",
    )
    stored = ToolCall.objects.get(pk=ours.pk)
    assert _values(stored, *differ) == _values(ToolCall.objects.get(pk=theirs.pk), *differ)
    assert _values(stored) == _values(ours)  # dates as the object has them
    assert stored.created_at is not None and stored.updated_at >= stored.created_at
    assert ours.changed_fields() == theirs.changed_fields() == ["updated_at"]
    assert sql.calls_in_run(run.pk) == ToolCall.objects.filter(run=run).count() == 2


def test_the_calls_insert_writes_the_message_outbox_enqueue_writes(run: Run) -> None:
    with transaction.atomic():
        call = _new_call(run, 1)
        ours = outbox.enqueue("toolcalls.dispatch", call.pk, write=False)
        with transitions.saved_once(call):
            sql_propose.insert_decided(call, created_at=timezone.now(), message=ours)
        theirs = outbox.enqueue("toolcalls.dispatch", call.pk)

    stored = {m.pk: m for m in OutboxMessage.objects.filter(pk__in=[ours.pk, theirs.pk])}
    assert _values(stored[ours.pk], "id", "created_at", "available_at") == _values(
        stored[theirs.pk], "id", "created_at", "available_at"
    )
    assert _values(stored[ours.pk]) == _values(ours)  # dates as the object has them
    assert not ours._state.adding and ToolCall.objects.filter(pk=call.pk).exists()


def _event_rows(ids: list[str]) -> list[str]:
    """The events as PostgreSQL gives them in JSON (jsonb as stored, times to the
    microsecond), in the order of `ids`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_jsonb(e)::text FROM runs_event e WHERE e.id = ANY(%s)"
            " ORDER BY array_position(%s, e.id)",
            [ids, ids],
        )
        return [row[0] for row in cursor.fetchall()]


DEFERRED = {"error_name": "tool.circuit_open", "until": "2026-01-02T03:04:06Z"}


def _deferred(run: Run, call: ToolCall) -> Event:
    return events.append(
        run=run,
        event_type="tool_call.deferred",
        payload=DEFERRED,
        producer="test",
        ids=events.Ids(tool_call_id=call.pk),
    )


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.parametrize("with_message", [True, False], ids=["authorized", "held"])
def test_the_calls_insert_writes_the_blocks_events_as_the_orm_writes_them(
    run: Run, with_message: bool
) -> None:
    """The events appended before the call's INSERT go in its statement, those appended after
    in the batch's own INSERT at the block's end: the rows are those bulk_create writes of the
    same events."""
    with transaction.atomic():
        call = _new_call(run, 1)
        message = outbox.enqueue("toolcalls.dispatch", call.pk, write=False)
        with events.batch():
            with transitions.saved_once(call):
                before = [_deferred(run, call), _deferred(run, call)]
                with CaptureQueriesContext(connection) as queries:
                    sql_propose.insert_decided(
                        call, created_at=timezone.now(), message=message if with_message else None
                    )
            after = _deferred(run, call)
        written = [*before, after]
        ours = _event_rows([e.pk for e in written])
        transaction.set_rollback(True)
    with transaction.atomic():
        Event.objects.bulk_create([Event(**_values(e)) for e in written])
        theirs = _event_rows([e.pk for e in written])
        transaction.set_rollback(True)

    assert len(ours) == 3 and ours == theirs
    assert len(queries) == 1 and "runs_event" in queries[0]["sql"]
    assert ("runs_outboxmessage" in queries[0]["sql"]) is with_message
    assert not any(e._state.adding for e in written)


def test_a_proposal_writes_its_events_chained_in_four_statements(
    run: Run, sandbox: Sandbox
) -> None:
    for n in (1, 2):  # the policy's row exists, and is cached
        propose_in(run, {**REFUND, "amount_cents": n}, intent=f"earlier-{n}")

    with CaptureQueriesContext(connection) as queries:
        call, created = tool_call_propose(
            tenant=run.tenant,
            run_id=run.pk,
            capability_id="refund-order-v2",
            args={**REFUND, "amount_cents": 3},
            intent="third",
            actor="test",
        )

    assert created and call.execution_status == "authorized"
    events = list(Event.objects.filter(run=run).order_by("seq"))
    assert [e.event_type for e in events if e.tool_call_id == call.pk] == [
        "tool_call.proposed",
        "tool_call.authorized",
    ]
    assert verify_chain(events) == []
    # The call is written before its events are recorded (bench_dispatch's "propose tx" is
    # the time from the one to the authorization).
    mine = [e for e in events if e.tool_call_id == call.pk]
    assert ToolCall.objects.get(pk=call.pk).created_at <= mine[0].recorded_at
    # The lookup; then in the transaction: lock the run, its tally (calls, chain head, newest
    # policy), the call's INSERT as authorized with its outbox row and its events (BEGIN and
    # COMMIT are not queries here). The events neither lock the run again nor read its head.
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == 4, "\n".join(s[:90] for s in statements)
    assert "runs_outboxmessage" in statements[3] and "runs_event" in statements[3]
    assert not any(s.startswith("UPDATE") for s in statements)
    assert not any("runs_run" in s and "FOR UPDATE" in s for s in statements[2:])


def test_the_envelopes_relations_are_the_orms(run: Run, sandbox: Sandbox) -> None:
    first = propose_in(run, {**REFUND, "amount_cents": 5}, intent="first")
    dispatch.tool_call_dispatch(tool_call_id=first.pk)  # an attempt
    second = propose_in(run, {**REFUND, "amount_cents": 6}, intent="second", depends_on=[first.pk])
    undo = ToolCall(
        tenant=run.tenant,
        run=run,
        capability_id="refund-order-v2",
        intent="undo",
        object_ref=REF,
        args=REFUND,
        args_digest="u" * 64,
        idempotency_key="undo",
        external_request_id="req_undo",
        compensation_of=first,
    )
    undo.save(force_insert=True)

    held = propose_in(run, BIG_REFUND, intent="big")  # the policy asks a person

    for call in (first, second, held):
        call = ToolCall.objects.get(pk=call.pk)
        compensation = call.compensations.first()
        assert sql.call_relations(call) == sql.Relations(
            call.attempts.count(),
            compensation.pk if compensation else None,
            [dependency.pk for dependency in call.depends_on.all()],
            call.approvals.exists(),
        )
    assert sql.call_relations(first) == sql.Relations(1, undo.pk, [], False)
    assert sql.call_relations(second) == sql.Relations(0, None, [first.pk], False)
    assert sql.call_relations(held).has_approvals


def test_a_new_calls_answer_is_the_one_read_back(agent: ApiClient, sandbox: Sandbox) -> None:
    """The POST answers a new call with relations it knows (envelope.new_call_relations)
    instead of reading them: the same answer as a GET that reads them, for a call authorized,
    one held for people and one with dependencies (given twice, out of order)."""
    run_id = start_run(agent)
    first = propose(agent, {**REFUND, "amount_cents": 7}, intent="first", run_id=run_id)
    second = propose(agent, {**REFUND, "amount_cents": 8}, intent="second", run_id=run_id)
    held = propose(agent, BIG_REFUND, intent="held", run_id=run_id)
    after = propose(
        agent,
        {**REFUND, "amount_cents": 9},
        intent="after",
        run_id=run_id,
        depends_on=[second["tool_call_id"], first["tool_call_id"], second["tool_call_id"]],
    )
    assert held["status"] == "awaiting_approval" and held["approval"] is not None
    assert after["depends_on"] == sorted([first["tool_call_id"], second["tool_call_id"]])
    for answer in (first, held, after):
        read = agent.get(f"/api/v1/tool-calls/{answer['tool_call_id']}").json()
        assert answer == read
