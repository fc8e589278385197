"""Agent API: runs, decisions, stop, and the error contract."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import ApiKey, Decision, Event, Run
from tests.helpers import ApiClient

RUN = {"title": "Refund order-001", "correlation_id": "refund-intent-031"}


def error_name(response) -> str:
    return response.json()["error"]["name"]


def nothing_written() -> bool:
    return not (Run.objects.exists() or Event.objects.exists() or Decision.objects.exists())


def test_it_starts_a_run(agent: ApiClient) -> None:
    response = agent.post("/api/v1/runs", {**RUN, "max_tool_calls": 5, "metadata": {"k": 1}})
    assert response.status_code == 201
    body = response.json()
    assert body["run_id"].startswith("run_")
    assert body["state"] == "active"
    assert body["max_tool_calls"] == 5
    run = Run.objects.get(pk=body["run_id"])
    assert run.correlation_id == "refund-intent-031"
    assert list(run.events.values_list("event_type", flat=True)) == ["run.started"]


def test_it_defaults_the_correlation_id_to_the_run_id(agent: ApiClient) -> None:
    body = agent.post("/api/v1/runs", {"title": "t"}).json()
    assert body["correlation_id"] == body["run_id"]


def test_a_retry_with_the_same_idempotency_key_returns_the_same_run(agent: ApiClient) -> None:
    first = agent.post("/api/v1/runs", RUN, headers={"Idempotency-Key": "start-1"})
    again = agent.post("/api/v1/runs", RUN, headers={"Idempotency-Key": "start-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["run_id"] == first.json()["run_id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1
    assert Event.objects.count() == 1


def test_the_same_idempotency_key_with_another_body_is_a_conflict(agent: ApiClient) -> None:
    agent.post("/api/v1/runs", RUN, headers={"Idempotency-Key": "start-1"})
    response = agent.post(
        "/api/v1/runs", {**RUN, "title": "Other"}, headers={"Idempotency-Key": "start-1"}
    )
    assert response.status_code == 409
    assert error_name(response) == "idempotency.conflict"
    assert Run.objects.count() == 1


def test_it_reads_a_run(agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", RUN).json()["run_id"]
    response = agent.get(f"/api/v1/runs/{run_id}")
    assert response.status_code == 200
    assert response.json()["title"] == RUN["title"]


def test_it_records_decisions_and_versions(agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", RUN).json()["run_id"]
    first = agent.post(
        f"/api/v1/runs/{run_id}/decisions",
        {"kind": "refund_eligibility", "content": {"eligible": True, "amount_cents": 12000}},
    )
    assert first.status_code == 201
    decision_id = first.json()["decision_id"]
    assert decision_id.startswith("dec_")
    second = agent.post(
        f"/api/v1/runs/{run_id}/decisions",
        {"kind": "refund_eligibility", "content": {"eligible": False}, "supersedes": decision_id},
    )
    assert second.status_code == 201
    assert second.json()["version"] == 2
    assert second.json()["supersedes"] == decision_id
    event = Event.objects.get(decision_id=second.json()["decision_id"])
    assert event.event_type == "decision.recorded"


def test_a_decision_cannot_supersede_one_of_another_kind(agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", RUN).json()["run_id"]
    decision_id = agent.post(
        f"/api/v1/runs/{run_id}/decisions", {"kind": "a", "content": {}}
    ).json()["decision_id"]
    response = agent.post(
        f"/api/v1/runs/{run_id}/decisions",
        {"kind": "b", "content": {}, "supersedes": decision_id},
    )
    assert response.status_code == 422
    assert error_name(response) == "decision.kind_mismatch"
    assert Decision.objects.count() == 1


def test_it_stops_a_run_once(agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", RUN).json()["run_id"]
    first = agent.post(f"/api/v1/runs/{run_id}/stop", {"reason": "user asked"})
    again = agent.post(f"/api/v1/runs/{run_id}/stop")
    assert first.status_code == again.status_code == 200
    assert again.json()["state"] == "cancelled"
    assert Event.objects.filter(event_type="run.cancelled").count() == 1
    closed = agent.post(f"/api/v1/runs/{run_id}/decisions", {"kind": "a", "content": {}})
    assert closed.status_code == 409
    assert error_name(closed) == "run.closed"


# --- errors: each rejected request writes nothing ------------------------------------------


def test_it_refuses_a_request_without_a_key(client, db: None) -> None:
    response = client.post("/api/v1/runs", data=RUN, content_type="application/json")
    assert response.status_code == 401
    assert error_name(response) == "auth.unauthenticated"
    assert nothing_written()


@pytest.mark.parametrize("token", ["garbage", "key_01ABC.wrong-secret"])
def test_it_refuses_a_bad_key(agent: ApiClient, token: str) -> None:
    response = ApiClient(token).post("/api/v1/runs", RUN)
    assert response.status_code == 401
    assert error_name(response) == "auth.unauthenticated"
    assert nothing_written()


def test_it_refuses_a_key_with_a_wrong_secret(agent: ApiClient) -> None:
    response = ApiClient(f"{agent.key.pk}.not-the-secret").post("/api/v1/runs", RUN)
    assert response.status_code == 401
    assert nothing_written()


def test_it_refuses_a_revoked_key(agent: ApiClient) -> None:
    from runs.services import api_key_revoke

    api_key_revoke(api_key=agent.key)
    response = agent.post("/api/v1/runs", RUN)
    assert response.status_code == 401
    assert nothing_written()


def test_it_refuses_an_expired_key_saying_it_expired(agent: ApiClient) -> None:
    ApiKey.objects.filter(pk=agent.key.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    response = agent.post("/api/v1/runs", RUN)
    assert response.status_code == 401
    assert error_name(response) == "auth.unauthenticated"
    assert "expired" in response.json()["error"]["message"]
    assert nothing_written()


def test_a_key_works_until_it_expires(agent: ApiClient) -> None:
    ApiKey.objects.filter(pk=agent.key.pk).update(expires_at=timezone.now() + timedelta(hours=1))
    assert agent.post("/api/v1/runs", RUN).status_code == 201


def test_an_expired_key_with_a_wrong_secret_is_not_told_it_expired(agent: ApiClient) -> None:
    ApiKey.objects.filter(pk=agent.key.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    response = ApiClient(f"{agent.key.pk}.not-the-secret").post("/api/v1/runs", RUN)
    assert response.status_code == 401
    assert "expired" not in response.json()["error"]["message"]


def test_another_tenants_run_is_not_found(agent: ApiClient, other_agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", RUN).json()["run_id"]
    events_before = Event.objects.count()
    for response in (
        other_agent.get(f"/api/v1/runs/{run_id}"),
        other_agent.post(f"/api/v1/runs/{run_id}/decisions", {"kind": "a", "content": {}}),
        other_agent.post(f"/api/v1/runs/{run_id}/stop"),
    ):
        assert response.status_code == 404
        assert error_name(response) == "resource.not_found"
    assert Event.objects.count() == events_before
    assert Run.objects.get(pk=run_id).state == "active"


def test_a_missing_run_is_not_found(agent: ApiClient) -> None:
    response = agent.get("/api/v1/runs/run_nope")
    assert response.status_code == 404
    assert "run_nope" in response.json()["error"]["message"]


def test_it_refuses_malformed_json(agent: ApiClient) -> None:
    response = agent.post("/api/v1/runs", raw='{"title": "x",')
    assert response.status_code == 400
    assert error_name(response) == "request.malformed_json"
    assert nothing_written()


def test_it_names_each_bad_field_and_rejects_unknown_ones(agent: ApiClient) -> None:
    response = agent.post("/api/v1/runs", {"title": "", "max_tool_calls": 0, "surprise": True})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["name"] == "request.validation_failed"
    fields = {detail["field"] for detail in error["details"]}
    assert fields == {"title", "max_tool_calls", "surprise"}
    assert "surprise" in error["message"]
    assert nothing_written()


def test_it_refuses_a_body_that_is_not_an_object(agent: ApiClient) -> None:
    response = agent.post("/api/v1/runs", raw="[1, 2]")
    assert response.status_code == 422
    assert nothing_written()


def test_it_refuses_an_oversized_body(agent: ApiClient, settings) -> None:
    body = json.dumps({**RUN, "metadata": {"blob": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE)}})
    response = agent.post("/api/v1/runs", raw=body)
    assert response.status_code == 413
    assert error_name(response) == "request.too_large"
    assert nothing_written()


def test_a_bad_decision_writes_nothing(agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", RUN).json()["run_id"]
    response = agent.post(f"/api/v1/runs/{run_id}/decisions", {"kind": "a", "content": "no"})
    assert response.status_code == 422
    assert [d["field"] for d in response.json()["error"]["details"]] == ["content"]
    assert Decision.objects.count() == 0
    assert Event.objects.count() == 1


def test_the_openapi_document_lists_the_endpoints(client) -> None:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/decisions",
        "/api/v1/runs/{run_id}/stop",
    } <= set(paths)


# --- external_ref: the framework's thread or conversation id ----------------------------------


def test_a_run_started_again_with_its_external_ref_is_the_same_run(agent: ApiClient) -> None:
    body = {**RUN, "external_ref": "thread-7f3a"}
    first = agent.post("/api/v1/runs", body)
    again = agent.post("/api/v1/runs", body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["run_id"] == first.json()["run_id"]
    assert again.json()["external_ref"] == "thread-7f3a"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1
    assert Event.objects.count() == 1


def test_the_same_external_ref_with_another_body_is_a_conflict(agent: ApiClient) -> None:
    agent.post("/api/v1/runs", {**RUN, "external_ref": "thread-7f3a"})
    response = agent.post("/api/v1/runs", {**RUN, "title": "Other", "external_ref": "thread-7f3a"})
    assert response.status_code == 409
    assert error_name(response) == "idempotency.conflict"
    assert Run.objects.count() == 1


def test_external_refs_are_per_tenant(agent: ApiClient, other_agent: ApiClient) -> None:
    mine = agent.post("/api/v1/runs", {**RUN, "external_ref": "thread-1"})
    theirs = other_agent.post("/api/v1/runs", {**RUN, "external_ref": "thread-1"})
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["run_id"] != theirs.json()["run_id"]


def test_runs_without_an_external_ref_are_distinct(agent: ApiClient) -> None:
    first = agent.post("/api/v1/runs", RUN).json()
    second = agent.post("/api/v1/runs", RUN).json()
    assert first["run_id"] != second["run_id"]
    assert first["external_ref"] is None


def test_the_external_ref_is_replayed_from_the_log(agent: ApiClient) -> None:
    from runs import projections

    agent.post("/api/v1/runs", {**RUN, "external_ref": "thread-7f3a"})
    assert Event.objects.get().payload["external_ref"] == "thread-7f3a"
    assert projections.verify() == []
