"""toolcalls/sql.py reads exactly what the ORM reads: the same call, run and tenant, and the
claim's readiness (attempts, dependencies, newest policy, breaker); the policy cache never
hides a newer version."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import Policy
from approvals.policies import current_policy
from approvals.sql import newest_policy_id
from runs.models import Run
from tests.helpers import REFUND, open_the_circuit, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch, sql, sql_batch
from toolcalls.models import Attempt, ToolCall

pytestmark = pytest.mark.django_db


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_the_lock_reads_what_the_orm_reads(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)  # a result, a receipt: JSON and dates
    orm = ToolCall.objects.select_related("run", "tenant").get(pk=call.pk)

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = sql.lock_call(call.pk)
        run_state, slug = locked.run.state, locked.tenant.slug  # no further query

    assert len(queries) == 1 and "FOR NO KEY UPDATE OF" in queries[0]["sql"]
    assert _values(locked) == _values(orm)
    assert _values(locked.run) == _values(orm.run)
    assert _values(locked.tenant) == _values(orm.tenant)
    assert (run_state, slug) == (orm.run.state, orm.tenant.slug)
    assert isinstance(locked.result, dict) and locked.result == orm.result
    assert locked.changed_fields() == ["updated_at"]  # it knows what it was read with


def test_the_lock_finds_no_call(run: Run) -> None:
    with transaction.atomic():
        assert sql.lock_call("tc_missing") is None


def test_readiness_answers_what_the_claim_asked_in_four_queries(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    policy = current_policy(run.tenant, call.capability_id)

    ready = sql.readiness(call)

    assert ready == sql.Readiness(
        attempts_in_run=Attempt.objects.filter(run=run).count(),
        has_dependencies=False,
        newest_policy_id=policy.pk,
        breaker_state=None,
    )


def test_readiness_sees_dependencies_attempts_and_an_open_breaker(
    run: Run, sandbox: Sandbox, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_the_circuit(run, sandbox, settings, monkeypatch)
    first = propose_in(run, {**REFUND, "amount_cents": 7}, intent="first")
    second = propose_in(run, {**REFUND, "amount_cents": 8}, intent="second", depends_on=[first.pk])

    ready = sql.readiness(second)

    assert ready.has_dependencies and ready.breaker_state == "open"
    assert ready.attempts_in_run == Attempt.objects.filter(run=run).count() > 0


def test_a_new_policy_version_is_never_hidden_by_the_cache(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    old = current_policy(run.tenant, call.capability_id)
    assert current_policy(run.tenant, call.capability_id, newest_id=old.pk) is old  # cached
    new = Policy.objects.create(
        tenant=run.tenant, capability_id=call.capability_id, version=old.version + 1, rules=[]
    )

    newest_id = sql.readiness(call).newest_policy_id
    assert newest_id == new.pk
    assert current_policy(run.tenant, call.capability_id, newest_id=newest_id).pk == new.pk


def test_the_newest_policy_id_is_the_orms(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    orm = Policy.objects.filter(tenant=run.tenant, capability_id=call.capability_id)

    assert newest_policy_id(run.tenant.pk, call.capability_id) == orm.order_by("-version")[0].pk
    assert newest_policy_id(run.tenant.pk, "no-such-capability") is None


def test_the_batch_lock_reads_what_the_single_lock_reads(run: Run, sandbox: Sandbox) -> None:
    first = propose_in(run, {**REFUND, "amount_cents": 7}, intent="first")
    dispatch.tool_call_dispatch(tool_call_id=first.pk)  # a result, a receipt: JSON and dates
    second = propose_in(run, {**REFUND, "amount_cents": 8}, intent="second")

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked = sql.lock_calls([second.pk, "tc_missing", first.pk], skip_locked=True)

    assert len(queries) == 1 and queries[0]["sql"].endswith("FOR NO KEY UPDATE OF c SKIP LOCKED")
    assert [call.pk for call in locked] == sorted([first.pk, second.pk])  # one run: by id
    for call in locked:
        with transaction.atomic():
            single = sql.lock_call(call.pk)
        assert _values(call) == _values(single)
        assert _values(call.run) == _values(single.run)
        assert _values(call.tenant) == _values(single.tenant)


def test_the_batch_readiness_is_each_calls_readiness(
    run: Run, sandbox: Sandbox, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_the_circuit(run, sandbox, settings, monkeypatch)
    first = propose_in(run, {**REFUND, "amount_cents": 7}, intent="first")
    second = propose_in(run, {**REFUND, "amount_cents": 8}, intent="second", depends_on=[first.pk])
    calls = list(ToolCall.objects.filter(run=run))

    with CaptureQueriesContext(connection) as queries:
        batch = sql.readiness_of(calls)

    assert len(queries) == 1
    assert batch == {call.pk: sql.readiness(call) for call in calls}
    assert batch[second.pk].has_dependencies and not batch[first.pk].has_dependencies


def test_the_claims_lock_reads_the_calls_and_their_readiness_in_one_statement(
    run: Run, sandbox: Sandbox, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_the_circuit(run, sandbox, settings, monkeypatch)
    first = propose_in(run, {**REFUND, "amount_cents": 7}, intent="first")
    second = propose_in(run, {**REFUND, "amount_cents": 8}, intent="second", depends_on=[first.pk])
    ids = [second.pk, "tc_missing", first.pk]

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        calls, ready = sql_batch.lock_calls_ready(ids)

    assert len(queries) == 1 and queries[0]["sql"].endswith("FOR NO KEY UPDATE OF c SKIP LOCKED")
    with transaction.atomic():
        locked = sql.lock_calls(ids, skip_locked=True)
        assert ready == sql.readiness_of(locked)
    assert [call.pk for call in calls] == [call.pk for call in locked]
    for call, alone in zip(calls, locked, strict=True):
        assert _values(call) == _values(alone)
        assert _values(call.run) == _values(alone.run)
        assert _values(call.tenant) == _values(alone.tenant)
    assert ready[second.pk].has_dependencies and not ready[first.pk].has_dependencies
    assert ready[first.pk].breaker_state == "open"


def test_the_claims_lock_keeps_its_own_cursor_between_other_statements() -> None:
    # psycopg keeps a cursor's adapters while it runs the same statement (runs/cursors.py).
    with transaction.atomic():
        sql_batch.lock_calls_ready(["tc_missing"])
        kept = connection._kept_cursors[3].get(sql_batch._LOCK_MANY_READY)
        sql.lock_calls(["tc_missing"])
        sql_batch.lock_calls_ready(["tc_missing"])
        assert kept is not None
        assert connection._kept_cursors[3][sql_batch._LOCK_MANY_READY] is kept
