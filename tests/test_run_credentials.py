"""POST /api/v1/runs/{id}/credentials: a short-lived bearer token for one run, refused after
its run ends, after its expiry, and anywhere but its own run."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.credential_models import RunCredential
from runs.models import Decision, Event, Run, Tenant
from runs.selectors import hash_secret
from runs.services import api_key_issue
from tests.helpers import ApiClient, propose, start_run
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall


def mint(agent: ApiClient, run_id: str, **body: Any) -> Any:
    return agent.post(f"/api/v1/runs/{run_id}/credentials", {"ttl_s": 600, **body})


def worker_of(agent: ApiClient, run_id: str, **body: Any) -> ApiClient:
    """An agent worker holding only a credential for `run_id`."""
    response = mint(agent, run_id, **body)
    assert response.status_code == 201, response.json()
    return ApiClient(response.json()["token"])


def error_name(response: Any) -> str:
    return response.json()["error"]["name"]


def test_it_mints_a_token_shown_once_and_stores_only_its_hash(agent: ApiClient) -> None:
    run_id = start_run(agent)
    response = mint(agent, run_id, scopes=["payments.refund"])
    assert response.status_code == 201, response.json()
    body = response.json()
    credential = RunCredential.objects.get(pk=body["credential_id"])
    assert body["token"].startswith(f"{credential.pk}.")
    assert credential.secret_hash == hash_secret(body["token"].partition(".")[2])
    assert (credential.run_id, credential.scopes) == (run_id, ["payments.refund"])
    assert 590 <= (credential.expires_at - timezone.now()).total_seconds() <= 600
    [minted] = Event.objects.filter(run_id=run_id, event_type="run.credential_minted")
    assert minted.payload["credential_id"] == credential.pk
    secret = body["token"].partition(".")[2]
    assert secret not in json.dumps(list(Event.objects.values_list("payload", flat=True)))


def test_the_credential_acts_on_its_own_run(agent: ApiClient) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id)
    assert worker.get(f"/api/v1/runs/{run_id}").status_code == 200
    decision = worker.post(
        f"/api/v1/runs/{run_id}/decisions", {"kind": "eligibility", "content": {"ok": True}}
    )
    assert decision.status_code == 201
    # It acts for the key that minted it.
    [event] = Event.objects.filter(run_id=run_id, event_type="decision.recorded")
    assert event.actor == f"api_key:{agent.key.pk}"
    assert worker.get("/api/v1/capabilities").status_code == 200


def test_a_run_scoped_token_is_refused_after_the_run_completes(agent: ApiClient) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id)
    credential = RunCredential.objects.get(run_id=run_id)
    assert agent.post(f"/api/v1/runs/{run_id}/complete").json()["state"] == "completed"

    response = worker.get(f"/api/v1/runs/{run_id}")
    assert response.status_code == 401
    assert error_name(response) == "auth.credential_revoked"
    assert "completed" in response.json()["error"]["message"]
    credential.refresh_from_db()
    assert credential.revoked_at is not None
    [revoked] = Event.objects.filter(run_id=run_id, event_type="run.credentials_revoked")
    assert revoked.payload["credential_ids"] == [credential.pk]
    # The revocation is in the transaction of the run's end: right after it in the log.
    ended = Event.objects.get(run_id=run_id, event_type="run.completed")
    assert revoked.seq == ended.seq + 1
    # The key itself goes on working.
    assert agent.get(f"/api/v1/runs/{run_id}").status_code == 200


@pytest.mark.parametrize("ending", ["stop", "fail"])
def test_every_terminal_exit_revokes_it(agent: ApiClient, ending: str) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id)
    if ending == "stop":
        agent.post(f"/api/v1/runs/{run_id}/stop", {"reason": "enough"})
    else:
        agent.post(f"/api/v1/runs/{run_id}/complete", {"failed_permanently": True})
    assert not Run.objects.get(pk=run_id).is_open
    response = worker.post(
        f"/api/v1/runs/{run_id}/decisions", {"kind": "late", "content": {"x": 1}}
    )
    assert (response.status_code, error_name(response)) == (401, "auth.credential_revoked")
    assert not Decision.objects.filter(run_id=run_id).exists()


def test_a_run_scoped_token_is_refused_on_another_run(agent: ApiClient) -> None:
    mine, other = start_run(agent, "mine"), start_run(agent, "other")
    worker = worker_of(agent, mine)
    events_before = Event.objects.count()
    refused = [
        worker.get(f"/api/v1/runs/{other}"),
        worker.get(f"/api/v1/runs/{other}/progress"),
        worker.get(f"/api/v1/runs/{other}/resume"),
        worker.post(f"/api/v1/runs/{other}/decisions", {"kind": "k", "content": {}}),
        worker.post(f"/api/v1/runs/{other}/stop", {"reason": "not mine"}),
        worker.post(f"/api/v1/runs/{other}/complete"),
        worker.put(
            f"/api/v1/runs/{other}/checkpoints/main",
            {"schema_version": 1, "state": "s", "step_index": 0},
        ),
        worker.post(f"/api/v1/runs/{other}/feedback", {"rating": 1}),
        # Starting a run, or reading every run's trace, is not acting on its run either.
        worker.post("/api/v1/runs", {"title": "a run of its own"}),
        worker.get("/api/v1/eval-traces"),
    ]
    assert [(r.status_code, error_name(r)) for r in refused] == [
        (403, "auth.credential_run_bound")
    ] * len(refused)
    assert Event.objects.count() == events_before
    assert Run.objects.get(pk=other).state == "active"


def test_it_cannot_propose_into_or_touch_the_calls_of_another_run(
    agent: ApiClient, sandbox: Sandbox
) -> None:
    mine, other = start_run(agent, "mine"), start_run(agent, "other")
    others_call = propose(agent, run_id=other, intent="theirs")
    worker = worker_of(agent, mine)
    calls_before = ToolCall.objects.count()
    refund = {"order_id": "order-002", "amount_cents": 100, "currency": "USD"}
    into_other = worker.post(
        f"/api/v1/runs/{other}/tool-calls",
        {"capability": "refund-order-v2", "args": refund, "intent": "sneaky"},
    )
    read = worker.get(f"/api/v1/tool-calls/{others_call['tool_call_id']}")
    cancel = worker.post(f"/api/v1/tool-calls/{others_call['tool_call_id']}/cancel", {})
    for response in (into_other, read, cancel):
        assert (response.status_code, error_name(response)) == (
            403,
            "auth.credential_run_bound",
        )
    assert ToolCall.objects.count() == calls_before
    # In its own run it proposes, and reads its own call.
    own = propose(worker, refund, run_id=mine, intent="own")
    assert worker.get(f"/api/v1/tool-calls/{own['tool_call_id']}").status_code == 200


def test_its_scopes_are_what_it_may_propose(agent: ApiClient, sandbox: Sandbox) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id, scopes=["stock.reserve"])
    refused = propose(worker, run_id=run_id, status=403)
    assert refused["error"]["name"] == "auth.scope_missing"


def test_a_token_past_its_expiry_is_refused_by_name(agent: ApiClient) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id)
    RunCredential.objects.filter(run_id=run_id).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = worker.get(f"/api/v1/runs/{run_id}")
    assert (response.status_code, error_name(response)) == (401, "auth.credential_expired")


def test_a_wrong_secret_is_unauthenticated(agent: ApiClient) -> None:
    run_id = start_run(agent)
    token = mint(agent, run_id).json()["token"]
    forged = ApiClient(token.partition(".")[0] + ".not-the-secret")
    response = forged.get(f"/api/v1/runs/{run_id}")
    assert (response.status_code, error_name(response)) == (401, "auth.unauthenticated")


def test_scopes_wider_than_the_key_are_refused(tenant: Tenant) -> None:
    key, token = api_key_issue(tenant=tenant, name="refunds", scopes=["payments.refund"])
    agent = ApiClient(token, key)
    run_id = start_run(agent)
    for wider in (["*"], ["stock.reserve"], ["payments.*"], ["eval:read"]):
        response = mint(agent, run_id, scopes=wider)
        assert (response.status_code, error_name(response)) == (
            403,
            "credential.scope_too_wide",
        ), wider
    assert mint(agent, run_id, scopes=["refund-order-v2"]).status_code == 201
    assert mint(agent, run_id).json()["scopes"] == ["payments.refund"]
    unknown = mint(agent, run_id, scopes=["teleport.*"])
    assert (unknown.status_code, error_name(unknown)) == (422, "api_key.invalid_scope")
    assert RunCredential.objects.count() == 2


def test_a_ttl_over_the_cap_or_past_the_key_is_refused(tenant: Tenant, settings: Any) -> None:
    settings.RUN_CREDENTIAL_MAX_TTL_SECONDS = 900
    key, token = api_key_issue(
        tenant=tenant, name="k", scopes=["*"], expires_at=timezone.now() + timedelta(seconds=300)
    )
    agent = ApiClient(token, key)
    run_id = start_run(agent)
    for ttl in (901, 400):  # over the cap; past the key's own expiry
        response = mint(agent, run_id, ttl_s=ttl)
        assert (response.status_code, error_name(response)) == (422, "credential.ttl_too_long")
    assert mint(agent, run_id, ttl_s=200).status_code == 201


def test_a_credential_mints_no_other_and_a_closed_run_takes_none(agent: ApiClient) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id)
    again = mint(worker, run_id)
    assert (again.status_code, error_name(again)) == (403, "credential.minted_by_credential")
    agent.post(f"/api/v1/runs/{run_id}/complete")
    closed = mint(agent, run_id)
    assert (closed.status_code, error_name(closed)) == (409, "run.closed")


def test_a_revoked_key_takes_its_credentials_with_it(agent: ApiClient) -> None:
    run_id = start_run(agent)
    worker = worker_of(agent, run_id)
    agent.key.revoked_at = timezone.now()
    agent.key.save(update_fields=["revoked_at"])
    response = worker.get(f"/api/v1/runs/{run_id}")
    assert (response.status_code, error_name(response)) == (401, "auth.credential_revoked")


def test_another_tenant_cannot_mint_for_the_run(agent: ApiClient, other_agent: ApiClient) -> None:
    run_id = start_run(agent)
    assert mint(other_agent, run_id).status_code == 404
