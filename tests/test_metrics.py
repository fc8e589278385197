"""/metrics in Prometheus text and the dashboard: figures computed from stored state only."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.models import Approval
from console import metrics, sql
from runs.models import Event, Run, Tenant, User
from tests.helpers import (
    BIG_REFUND,
    REFUND,
    WAYBILL,
    fresh,
    logged_in,
    open_the_circuit,
    propose_in,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due, run_until
from toolcalls import dispatch, gate, reconcile, sweeps
from toolcalls.models import Receipt, ToolCall

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Every line a HELP, a TYPE or a sample `name{labels} value`, each sample after the TYPE
    of its family; the samples by (name, labels)."""
    samples: dict[tuple[str, frozenset], float] = {}
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "histogram"), line
            typed[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or typed.get(family) == "histogram", f"no TYPE for {name}"
        pairs = LABEL.findall(labels)
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == labels, labels
        key = (name, frozenset(pairs))
        assert key not in samples, f"sample twice: {line}"
        samples[key] = float(value)
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"tenant": "acme", **labels}.items()))]


def scrape(user: User) -> dict:
    response = logged_in(user).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    sql_reads_what_the_orm_reads(user.tenant)
    return parse(response.content.decode())


def sql_reads_what_the_orm_reads(tenant: Tenant) -> None:
    """console/sql.py, which /metrics reads on PostgreSQL, and the ORM's queries read the same
    rows, for one tenant and for all: each test's scrape checks it on that test's state."""
    if connection.vendor != "postgresql":
        return
    now = timezone.now()
    since = [now - timedelta(seconds=b) for b in metrics.UNKNOWN_DWELL_BUCKETS]
    for scope in (tenant, None):
        tenant_id = None if scope is None else scope.pk
        read = sql.metric_rows(tenant_id=tenant_id, now=now, dwell_since=since)
        orm = vars(metrics.metric_rows_orm(tenant=scope, now=now, dwell_since=since))
        assert {key: sorted(rows) for key, rows in read.items()} == {
            key: sorted(tuple(row) for row in rows) for key, rows in orm.items()
        }
        assert read["tenants"] == orm["tenants"] and read["breakers"] == orm["breakers"]


# --- the text -------------------------------------------------------------------------------


def test_an_admin_scrapes_their_tenants_figures_in_prometheus_text(
    admin_user: User, other_tenant: Tenant
) -> None:
    response = logged_in(admin_user).get("/metrics")
    text = response.content.decode()
    samples = parse(text)
    assert {dict(labels)["tenant"] for _, labels in samples} == {"acme"}
    assert "# TYPE countersign_approval_latency_seconds histogram" in text
    assert "# TYPE countersign_duplicate_effects_total counter" in text
    assert "# HELP countersign_remote_dedupe_replays_total " in text
    assert value(samples, "countersign_tool_calls_result_unknown") == 0
    assert value(samples, "countersign_approval_latency_seconds_count") == 0
    assert value(samples, "countersign_tool_calls", state="completed") == 0


def test_a_completed_call_is_counted_by_both_statuses(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    propose_in(run)
    run_due()
    samples = scrape(admin_user)
    assert value(samples, "countersign_tool_calls", state="completed") == 1
    assert value(samples, "countersign_tool_calls", state="authorized") == 0
    assert value(samples, "countersign_tool_call_verifications", state="confirmed_success") == 1
    assert value(samples, "countersign_tool_call_attempts_bucket", le="1.0") == 1
    assert value(samples, "countersign_tool_call_attempts_count") == 1


# --- unknown, expired, handed to a person ---------------------------------------------------


def test_a_lost_answer_is_an_unknown_call_with_its_dwell(
    admin_user: User, tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call = propose_in(run)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    assert fresh(call).execution_status == "result_unknown"
    samples = scrape(admin_user)
    assert value(samples, "countersign_tool_calls_result_unknown") == 1
    assert value(samples, "countersign_tool_calls", state="result_unknown") == 1
    assert 0 <= value(samples, "countersign_tool_calls_result_unknown_oldest_seconds") < 30
    entered = Event.objects.get(tool_call_id=call.pk, event_type="tool_call.result_unknown")
    later = entered.occurred_at + timedelta(seconds=42)
    figures = metrics.collect(tenant=tenant, now=later)["acme"]
    assert figures.oldest_unknown_seconds == 42


def test_a_dispatching_call_whose_lease_expired_is_counted(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)
    dispatch.tool_call_claim(tool_call_id=call.pk, outbox_id=None, worker="paused-worker")
    assert value(scrape(admin_user), "countersign_tool_calls_lease_expired") == 0
    ToolCall.objects.filter(pk=call.pk).update(lease_expires_at=timezone.now() - timedelta(1))
    assert value(scrape(admin_user), "countersign_tool_calls_lease_expired") == 1


def test_a_call_and_its_run_handed_to_a_person_are_counted(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    # A cancellation has no look-up and no remote deduplication: a lost answer goes to a person.
    sandbox.faults(system="carrier", drop_response_after_commit=1.0, times=1)
    call = propose_in(run, {"waybill_id": "wb_seed0001"}, capability="cancel-waybill-v1")
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    reconcile.tool_call_reconcile(tool_call_id=call.pk)
    assert fresh(call).execution_status == "needs_human"
    samples = scrape(admin_user)
    assert value(samples, "countersign_tool_calls_needs_human") == 1
    assert value(samples, "countersign_runs_needs_human") == 1
    assert value(samples, "countersign_tool_calls_result_unknown") == 0


# --- approvals and attempts -----------------------------------------------------------------


def test_approval_latency_is_a_histogram_of_decision_times(
    admin_user: User, approver: User, run: Run, sandbox: Sandbox
) -> None:
    quick = propose_in(run, BIG_REFUND, intent="quick")
    slow = propose_in(run, {**BIG_REFUND, "amount_cents": 26000}, intent="slow")
    quick_approval = Approval.objects.get(tool_call=quick)
    slow_approval = Approval.objects.get(tool_call=slow)
    # The second one waited two minutes for a person.
    Approval.objects.filter(pk=slow_approval.pk).update(
        created_at=timezone.now() - timedelta(minutes=2)
    )
    for approval, decide, extra in (
        (quick_approval, gate.tool_call_approve, {}),
        (slow_approval, gate.tool_call_reject, {"reason": "too much"}),
    ):
        approval.refresh_from_db()
        decide(
            tenant=run.tenant,
            approval_id=approval.pk,
            user=approver,
            seen_version=approval.version,
            seen_summary_hash=approval.summary_hash,
            **extra,
        )
    samples = scrape(admin_user)
    bucket = "countersign_approval_latency_seconds_bucket"
    assert value(samples, bucket, le="60.0") == 1
    assert value(samples, bucket, le="300.0") == 2
    assert value(samples, bucket, le="+Inf") == 2
    assert value(samples, "countersign_approval_latency_seconds_count") == 2
    expected = 0.0
    for approval, event_type in ((quick_approval, "approved"), (slow_approval, "rejected")):
        approval.refresh_from_db()
        decided = Event.objects.get(approval_id=approval.pk, event_type=f"approval.{event_type}")
        expected += (decided.occurred_at - approval.created_at).total_seconds()
    assert value(samples, "countersign_approval_latency_seconds_sum") == pytest.approx(expected)
    assert 120 <= expected < 130


def test_attempts_per_call_counts_retries(
    admin_user: User, run: Run, sandbox: Sandbox, monkeypatch
) -> None:
    monkeypatch.setattr(dispatch, "backoff", lambda policy, failures, retry_after: 0.0)
    propose_in(run, intent="at-once")
    run_due()
    sandbox.faults(system="payments", http_429=1.0, retry_after=0, times=2)
    retried = propose_in(run, {**REFUND, "amount_cents": 100}, intent="retried")
    run_until(lambda: fresh(retried).execution_status == "completed")
    samples = scrape(admin_user)
    bucket = "countersign_tool_call_attempts_bucket"
    assert [value(samples, bucket, le=le) for le in ("1.0", "2.0", "3.0", "+Inf")] == [1, 1, 2, 2]
    assert value(samples, "countersign_tool_call_attempts_sum") == 4
    assert value(samples, "countersign_tool_call_attempts_count") == 2


# --- duplicates and deduplicated resends ----------------------------------------------------


def a_stale_worker_sends_late(call: ToolCall) -> None:
    """A worker claims the call and pauses; its lease expires, the call is looked up and sent
    again; then the paused worker wakes up and sends too."""
    stale = dispatch.tool_call_claim(tool_call_id=call.pk, outbox_id=None, worker="paused-worker")
    ToolCall.objects.filter(pk=call.pk).update(lease_expires_at="2000-01-01T00:00:00Z")
    assert sweeps.leases_sweep_expired() == 1
    run_until(lambda: fresh(call).execution_status == "completed", timeout=30)
    dispatch.record_outcome(stale, dispatch.send(stale))


def test_a_second_waybill_from_a_stale_worker_is_a_duplicate_effect(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run, WAYBILL, capability="create-waybill-v1")
    a_stale_worker_sends_late(call)
    assert len(sandbox.ledger("carrier")) == 2  # the carrier ignores idempotency keys
    samples = scrape(admin_user)
    assert value(samples, "countersign_duplicate_effects_total") == 1
    assert value(samples, "countersign_remote_dedupe_replays_total") == 0


def test_a_stale_resend_the_system_deduplicated_is_no_duplicate(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)
    a_stale_worker_sends_late(call)
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert value(scrape(admin_user), "countersign_duplicate_effects_total") == 0


def test_a_resend_answered_as_already_existing_is_a_remote_dedupe_replay(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    # The look-up lags behind the refund, so the call is sent again with the same key.
    sandbox.faults(
        system="payments", drop_response_after_commit=1.0, times=1, lookup_lag_seconds=60
    )
    call = propose_in(run)
    run_until(lambda: fresh(call).execution_status == "completed", timeout=30)
    assert fresh(call).receipts.get().status == Receipt.Status.ALREADY_EXISTS
    samples = scrape(admin_user)
    assert value(samples, "countersign_remote_dedupe_replays_total") == 1
    assert value(samples, "countersign_duplicate_effects_total") == 0


# --- circuit breakers -----------------------------------------------------------------------


def test_an_open_circuit_is_2_and_closed_again_0(
    admin_user: User, run: Run, sandbox: Sandbox, settings, monkeypatch
) -> None:
    calls = open_the_circuit(run, sandbox, settings, monkeypatch)
    breaker = "countersign_circuit_breaker_state"
    assert value(scrape(admin_user), breaker, capability="refund-order-v2") == 2
    sandbox.clear_faults()
    run_until(lambda: all(fresh(c).execution_status == "completed" for c in calls), timeout=30)
    assert value(scrape(admin_user), breaker, capability="refund-order-v2") == 0


# --- who may read them ----------------------------------------------------------------------


def test_the_token_reads_every_tenant(
    client: Client, settings, tenant: Tenant, other_tenant: Tenant
) -> None:
    settings.METRICS_TOKEN = "scrape-me-0123456789"
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape-me-0123456789"})
    assert response.status_code == 200
    samples = parse(response.content.decode())
    assert {dict(labels)["tenant"] for _, labels in samples} == {"acme", "globex"}


def test_a_wrong_token_is_401(client: Client, settings, admin_user: User) -> None:
    settings.METRICS_TOKEN = "scrape-me-0123456789"
    for header in ("Bearer scrape-me-012345678", "Bearer ", "Basic scrape-me-0123456789"):
        response = client.get("/metrics", headers={"Authorization": header})
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
    signed_in = logged_in(admin_user).get("/metrics", headers={"Authorization": "Bearer nope"})
    assert signed_in.status_code == 401


def test_no_token_is_accepted_while_the_setting_is_empty(client: Client, settings) -> None:
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401


def test_anonymous_scrapers_and_people_who_are_not_admins_get_403(
    client: Client, approver: User, viewer: User
) -> None:
    assert client.get("/metrics").status_code == 403
    for user in (approver, viewer):
        assert logged_in(user).get("/metrics").status_code == 403


# --- the dashboard --------------------------------------------------------------------------


def test_the_dashboard_shows_the_figures_and_polls_for_them(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    dispatch.tool_call_dispatch(tool_call_id=propose_in(run).pk)
    response = logged_in(admin_user).get("/dashboard/")
    assert response.status_code == 200
    assert response.context["figures"].result_unknown == 1
    content = response.content.decode()
    assert "<html" in content
    assert "Outcome unknown" in content
    assert "hx-trigger=\"every 5s [document.visibilityState === 'visible']\"" in content


def test_the_dashboards_poll_gets_only_the_figures(admin_user: User) -> None:
    response = logged_in(admin_user).get("/dashboard/", headers={"HX-Request": "true"})
    assert response.status_code == 200
    content = response.content.decode()
    assert "<html" not in content
    assert content.lstrip().startswith('<div id="figures"')
    assert "Outcome unknown" in content


def test_the_dashboard_is_for_admins_only(client: Client, approver: User, viewer: User) -> None:
    for user in (approver, viewer):
        assert logged_in(user).get("/dashboard/").status_code == 403
    assert client.get("/dashboard/").status_code == 302
