"""The approver's decision reads and locks with toolcalls/sql.py's statements: they load exactly
what the ORM's queries loaded (the approval with its tenant, run, call and policy; the call with
its run and tenant), in one statement each, and the locked statement holds both rows as the two
ORM locks did (issue 12: the approve POST's CPU)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from approvals.policies import current_policy
from runs import pipeline
from runs.models import OutboxMessage, Run, Tenant, User
from tests.helpers import BIG_REFUND, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch, gate
from toolcalls import sql as toolcalls_sql
from toolcalls import sql_decision as sql
from toolcalls.models import ToolCall
from toolcalls.selectors import calls_effect_pending
from toolcalls.webhook_models import Webhook

pytestmark = pytest.mark.django_db


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


@pytest.fixture
def waiting(run: Run, sandbox: Sandbox) -> Approval:
    return Approval.objects.get(tool_call=propose_in(run, BIG_REFUND))


def test_the_read_loads_what_the_orm_loads(waiting: Approval) -> None:
    orm = Approval.objects.select_related("tenant", "run", "tool_call").get(pk=waiting.pk)

    with CaptureQueriesContext(connection) as queries:
        found = sql.decision_read(tenant_id=waiting.tenant_id, approval_id=waiting.pk)
        read = found.approval
        related = (read.tenant.slug, read.run.state, read.tool_call.execution_status)

    assert len(queries) == 1
    assert found.open_calls == []  # the call itself is not one of them
    assert _values(read) == _values(orm)
    assert _values(read.tenant) == _values(orm.tenant)
    assert _values(read.run) == _values(orm.run)
    assert _values(read.tool_call) == _values(orm.tool_call)
    assert related == ("acme", orm.run.state, "awaiting_approval")
    assert isinstance(read.args, dict) and read.args == orm.args
    assert read.changed_fields() == ["updated_at"]  # it knows what it was read with


def test_the_read_finds_the_open_calls_the_business_check_counts(
    run: Run, waiting: Approval
) -> None:
    """As `calls_effect_pending(..., exclude=the call)`: the same calls, oldest first, with
    the same values; not the calls on another object nor the final ones."""
    order = BIG_REFUND["order_id"]
    pending = propose_in(run, {**BIG_REFUND, "amount_cents": 5_000}, intent="pending")
    small = propose_in(run, {**BIG_REFUND, "amount_cents": 100}, intent="small")
    ToolCall.objects.filter(pk=small.pk).update(
        execution_status="completed", verification_status="confirmed_success"
    )  # final and seen at the system: not counted
    propose_in(run, {**BIG_REFUND, "order_id": "order-001", "amount_cents": 100}, intent="other")
    ToolCall.objects.filter(pk=pending.pk).update(external_request_id="req-1")
    call = waiting.tool_call
    orm = calls_effect_pending(
        tenant=waiting.tenant,
        capability_id=call.capability_id,
        object_ref=f"order:{order}",
        exclude=call.pk,
    )
    expected = [
        (o.pk, o.args, o.execution_status, o.external_request_id, o.external_id) for o in orm
    ]

    found = sql.decision_read(tenant_id=waiting.tenant_id, approval_id=waiting.pk)

    assert [row[0] for row in expected] == [pending.pk]
    assert found.open_calls == expected


def test_the_read_finds_no_approval_of_another_tenant(waiting: Approval) -> None:
    other = Tenant.objects.create(slug="other", name="Other")
    assert sql.decision_read(tenant_id=other.pk, approval_id=waiting.pk) is None
    assert sql.decision_read(tenant_id=waiting.tenant_id, approval_id="apr_missing") is None


def test_the_lock_loads_what_the_two_orm_locks_loaded(waiting: Approval) -> None:
    orm = Approval.objects.select_related("run", "tool_call", "policy").get(pk=waiting.pk)
    orm_call = ToolCall.objects.select_related("run", "tenant").get(pk=waiting.tool_call_id)

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = sql.lock_for_decision(tenant_id=waiting.tenant_id, approval_id=waiting.pk)
        approval, call = locked.approval, locked.call
        related = (approval.policy.pk, approval.run.pk, call.run.state, call.tenant.slug)

    assert len(queries) == 1
    assert "FOR UPDATE OF" in queries[0]["sql"] and "FOR NO KEY UPDATE OF" in queries[0]["sql"]
    assert _values(approval) == _values(orm)
    assert _values(approval.policy) == _values(orm.policy)
    assert _values(approval.run) == _values(orm.run)
    assert _values(call) == _values(orm_call)
    assert _values(call.run) == _values(orm_call.run)
    assert _values(call.tenant) == _values(orm_call.tenant)
    assert approval.tool_call is call  # one object for the locked row
    assert related == (orm.policy_id, orm.run_id, orm_call.run.state, "acme")
    assert approval.changed_fields() == ["updated_at"]
    assert call.changed_fields() == ["updated_at"]
    assert locked.decided_wanted is False  # the tenant has no webhook


def _hooks_none_wants(tenant: Tenant, other_tenant: Tenant) -> Webhook:
    """Hooks that must not count: another tenant's, one of other events, a chat channel, and an
    inactive one (returned, to be switched on)."""
    url = "https://hooks.example"
    Webhook.objects.create(tenant=other_tenant, url=url, event_types=["approval.decided"])
    Webhook.objects.create(tenant=tenant, url=url, event_types=["tool_call.terminal"])
    Webhook.objects.create(
        tenant=tenant, url=url, kind=Webhook.Kind.SLACK, event_types=["approval.decided"]
    )
    return Webhook.objects.create(
        tenant=tenant, url=url, active=False, event_types=["approval.decided"]
    )


def _lock_wants(tenant: Tenant, approval: Approval) -> bool:
    with transaction.atomic():
        return sql.lock_for_decision(tenant_id=tenant.pk, approval_id=approval.pk).decided_wanted


def test_the_lock_answers_whether_a_receiver_wants_the_decision_as_the_orm(
    tenant: Tenant, other_tenant: Tenant, waiting: Approval
) -> None:
    """In the lock's statement, as `receivers_want` and the ORM answer: not a chat channel, an
    inactive hook, another tenant's, nor one of other events."""
    off = _hooks_none_wants(tenant, other_tenant)
    assert _lock_wants(tenant, waiting) is _wants(tenant) is _orm_wants(tenant) is False
    Webhook.objects.filter(pk=off.pk).update(active=True)
    assert _lock_wants(tenant, waiting) is _wants(tenant) is _orm_wants(tenant) is True


def test_the_lock_finds_no_approval_of_another_tenant(waiting: Approval) -> None:
    other = Tenant.objects.create(slug="other", name="Other")
    with transaction.atomic():
        assert sql.lock_for_decision(tenant_id=other.pk, approval_id=waiting.pk) is None


def _can_lock(table: str, row_id: str, strength: str) -> bool:
    """Whether another connection gets `strength` on the row at once."""
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as other:
        try:
            other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR {strength} NOWAIT", [row_id])
        except psycopg.errors.LockNotAvailable:
            return False
    return True


@pytest.mark.django_db(transaction=True)
def test_the_lock_holds_the_approval_and_the_run_for_update_and_the_call_for_no_key_update(
    waiting: Approval,
) -> None:
    with transaction.atomic():
        sql.lock_for_decision(tenant_id=waiting.tenant_id, approval_id=waiting.pk)
        assert not _can_lock("approvals_approval", waiting.pk, "KEY SHARE")
        assert not _can_lock("toolcalls_toolcall", waiting.tool_call_id, "NO KEY UPDATE")
        # A row that only refers to the call (an attempt, a dependency) is not held up.
        assert _can_lock("toolcalls_toolcall", waiting.tool_call_id, "KEY SHARE")
        # As the events' lock holds it (runs/sql.py lock_and_read_head).
        assert not _can_lock("runs_run", waiting.run_id, "KEY SHARE")
    assert _can_lock("approvals_approval", waiting.pk, "UPDATE")
    assert _can_lock("runs_run", waiting.run_id, "UPDATE")


def _connect() -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"])


def _waits_for_lock(watcher: psycopg.Connection, pid: int) -> bool:
    """Whether the backend `pid` waits for a lock, polled until it does (or for a minute)."""
    query = "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)"
    for _ in range(600):
        if watcher.execute(query, [pid]).fetchone()[0]:
            return True
        threading.Event().wait(0.1)
    return False


def _locks_while(waiting: Approval, held: tuple[str, str]) -> dict[str, bool]:
    """While another transaction holds `held` (table, id) FOR UPDATE and the decision's lock
    statement waits for it: which of the decision's rows that statement holds already."""
    rows = {
        "approval": ("approvals_approval", waiting.pk, "KEY SHARE"),
        "call": ("toolcalls_toolcall", waiting.tool_call_id, "NO KEY UPDATE"),
        "run": ("runs_run", waiting.run_id, "KEY SHARE"),
    }
    params = [*sql._DECIDED_RECEIVERS, waiting.tenant_id, waiting.pk]
    with _connect() as holder, _connect() as locker, _connect() as watcher:
        holder.execute(f"SELECT 1 FROM {held[0]} WHERE id = %s FOR UPDATE", [held[1]])
        statement = threading.Thread(target=locker.execute, args=(sql._DECISION_LOCK, params))
        statement.start()
        assert _waits_for_lock(watcher, locker.info.backend_pid)
        taken = {name: not _can_lock(*row) for name, row in rows.items() if row[:2] != held}
        holder.commit()
        statement.join()
        locker.commit()
    return taken


@pytest.mark.django_db(transaction=True)
def test_the_lock_takes_the_approval_then_the_call_then_the_run(waiting: Approval) -> None:
    """The order the decision took them in before the run's lock joined the statement (the
    events' lock came after the call's): waiting for the run, it holds the other two; for the
    call, the approval only; for the approval, neither."""
    assert _locks_while(waiting, ("runs_run", waiting.run_id)) == {"approval": True, "call": True}
    assert _locks_while(waiting, ("toolcalls_toolcall", waiting.tool_call_id)) == {
        "approval": True,
        "run": False,
    }
    assert _locks_while(waiting, ("approvals_approval", waiting.pk)) == {
        "call": False,
        "run": False,
    }


# --- the claim of an approved call ----------------------------------------------------------


@pytest.fixture
def approved(waiting: Approval, approver: User) -> Approval:
    """Approved through the console's service: the call is authorized, its dispatch queued."""
    return gate.tool_call_approve(
        tenant=waiting.tenant,
        approval_id=waiting.pk,
        user=approver,
        seen_version=waiting.version,
        seen_summary_hash=waiting.summary_hash,
    )


def test_the_claims_lock_loads_what_the_orm_read_and_lock_loaded(approved: Approval) -> None:
    """As `call.approvals.order_by("-created_at").first()` then approval_consume's
    `select_for_update().select_related("run", "tool_call").get(pk=...)`: the same row, with the
    caller's locked call and its run as the approval's call and run."""
    call = ToolCall.objects.select_related("run", "tenant").get(pk=approved.tool_call_id)
    orm = Approval.objects.select_related("run", "tool_call").get(
        pk=call.approvals.order_by("-created_at").first().pk
    )

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = sql.lock_latest_approval(call)
        related = (locked.run.state, locked.tool_call.execution_status)

    assert len(queries) == 1 and queries[0]["sql"].endswith("FOR UPDATE OF a")
    assert _values(locked) == _values(orm)
    assert (locked.state, locked.approvals_so_far) == ("approved", 1)
    assert locked.tool_call is call and locked.run is call.run
    assert _values(locked.run) == _values(orm.run)
    assert related == (orm.run.state, "authorized")
    assert locked.changed_fields() == ["updated_at"]


def test_the_claims_lock_takes_the_latest_approval_and_none_without(
    run: Run, approved: Approval
) -> None:
    call = ToolCall.objects.select_related("run").get(pk=approved.tool_call_id)
    row = Approval.objects.filter(pk=approved.pk).values().get()
    later = approved.created_at + timedelta(seconds=1)
    Approval.objects.create(**{**row, "id": "apr_newer", "state": "pending", "created_at": later})
    with transaction.atomic():
        assert sql.lock_latest_approval(call).pk == "apr_newer"
        assert sql.lock_latest_approval(propose_in(run, intent="no-approval")) is None


@pytest.mark.django_db(transaction=True)
def test_the_claims_lock_holds_the_approval_for_update(approved: Approval) -> None:
    call = ToolCall.objects.select_related("run").get(pk=approved.tool_call_id)
    with transaction.atomic():
        sql.lock_latest_approval(call)
        assert not _can_lock("approvals_approval", approved.pk, "KEY SHARE")
    assert _can_lock("approvals_approval", approved.pk, "UPDATE")


# The outbox message marked done; the call locked with its run and tenant; its readiness; its
# latest approval locked (1: lock_latest_approval; a read and a locked read before); the run
# locked and its chain head (2, the events' batch); the approval's, the call's UPDATE; the
# attempt's and the events' INSERT; the savepoint and its release (2).
CLAIM_QUERIES = 11


def test_the_claim_of_an_approved_call_costs_its_fixed_queries(approved: Approval) -> None:
    # As in a worker after its first claim: the newest policy is in the process's cache.
    current_policy(approved.tenant, approved.tool_call.capability_id)
    with CaptureQueriesContext(connection) as queries:
        claim = dispatch.tool_call_claim(tool_call_id=approved.tool_call_id, outbox_id=None)
    assert claim is not None
    assert len(queries) == CLAIM_QUERIES, "\n".join(q["sql"][:100] for q in queries)
    approved.refresh_from_db()
    assert approved.state == "consumed"
    assert ToolCall.objects.get(pk=approved.tool_call_id).execution_status == "dispatching"


def test_the_claims_writes_ride_with_its_reads(approved: Approval) -> None:
    """runs/pipeline.py: the outbox message marked done goes with the call's lock, and the
    approval's and call's UPDATEs, the attempt's and the events' INSERTs together at the end:
    the same statements (CLAIM_QUERIES) in fewer round trips."""
    current_policy(approved.tenant, approved.tool_call.capability_id)
    message = OutboxMessage.objects.get(task="toolcalls.dispatch_approved")
    seen: list[tuple[str, bool]] = []

    def record(execute, sql, params, many, context):
        words = sql.split()[:2] if not sql.startswith(("SAVEPOINT", "RELEASE")) else sql.split()[:1]
        seen.append((" ".join(words), pipeline.sending_together()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        claim = dispatch.tool_call_claim(tool_call_id=approved.tool_call_id, outbox_id=message.pk)
    assert claim is not None
    # This recorder wraps the block's own wrapper, so it sees the call's lock as it is handed
    # to the database, then the queued UPDATE, which the block sends ahead of it in the same
    # pipeline; the four writes at the end are sent together before the savepoint's release.
    assert seen == [
        ("SAVEPOINT", False),
        ('SELECT c."id",', False),
        ("UPDATE runs_outboxmessage", True),
        ("SELECT (SELECT", False),
        ('SELECT a."id",', False),
        ("SELECT id", False),
        ("SELECT id,", False),
        ('UPDATE "approvals_approval"', True),
        ('UPDATE "toolcalls_toolcall"', True),
        ("INSERT INTO", True),
        ("INSERT INTO", True),
        ("RELEASE", False),
    ]
    message.refresh_from_db()
    assert message.done_at is not None


# --- the decision's two questions -----------------------------------------------------------


def _orm_wants(tenant: Tenant) -> bool:
    hooks = Webhook.objects.filter(tenant=tenant, active=True).exclude(kind=Webhook.Kind.SLACK)
    return any("approval.decided" in hook.event_types for hook in hooks)


def _wants(tenant: Tenant) -> bool:
    with CaptureQueriesContext(connection) as queries:
        answer = toolcalls_sql.receivers_want(
            tenant_id=tenant.pk, event_type="approval.decided", except_kind=Webhook.Kind.SLACK
        )
    assert len(queries) == 1
    return answer


def test_whether_a_receiver_wants_the_decision_answers_as_the_orm(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    """Not a chat channel, an inactive hook, another tenant's, nor one of other events."""
    off = _hooks_none_wants(tenant, other_tenant)
    assert _wants(tenant) is _orm_wants(tenant) is False
    Webhook.objects.filter(pk=off.pk).update(active=True)
    assert _wants(tenant) is _orm_wants(tenant) is True
    assert _wants(other_tenant) is True


def test_whether_an_approval_of_the_run_is_pending_answers_as_the_orm(
    run: Run, waiting: Approval
) -> None:
    def orm() -> bool:
        return Approval.objects.filter(run=run, state=Approval.State.PENDING).exists()

    assert toolcalls_sql.approval_pending_in_run(run.pk) is orm() is True
    Approval.objects.filter(pk=waiting.pk).update(state="approved")
    assert toolcalls_sql.approval_pending_in_run(run.pk) is orm() is False
