"""PUT/GET /api/v1/runs/{id}/checkpoints/{name}: immutable versions, migrations on read,
and what a checkpoint refuses to keep."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connection, transaction

from memory import schemas
from memory.models import Checkpoint
from runs.models import Event
from tests.helpers import ApiClient, propose, start_run
from tests.sandbox_process import Sandbox

BODY = {
    "schema_version": 1,
    "kind": "refund-agent",
    "state": "deciding_amount",
    "step_index": 2,
    "input": {"order_id": "order-002"},
    "budgets": {"llm_tokens_left": 12000, "steps_left": 8},
    "data": {"amount": 2500, "legacy_note": "kept as it is"},
}


def put(agent: ApiClient, run_id: str, body: dict[str, Any], name: str = "main") -> Any:
    return agent.put(f"/api/v1/runs/{run_id}/checkpoints/{name}", body)


def error_name(response: Any) -> str:
    return response.json()["error"]["name"]


def saved_events(run_id: str) -> list[dict[str, Any]]:
    events = Event.objects.filter(run_id=run_id, event_type="checkpoint.saved").order_by("seq")
    return [event.payload for event in events]


@pytest.fixture
def run_id(agent: ApiClient) -> str:
    return start_run(agent, "refund with checkpoints")


@pytest.fixture
def three_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """refund-agent v1 → v2 moves `amount` into `data.refund.amount_cents`; v2 → v3 renames
    the state `deciding_amount` to `amount_decided`. Neither knows `legacy_note`."""

    def v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
        data = body["data"]
        data["refund"] = {"amount_cents": data.pop("amount")}
        return body

    def v2_to_v3(body: dict[str, Any]) -> dict[str, Any]:
        if body["state"] == "deciding_amount":
            body["state"] = "amount_decided"
        return body

    monkeypatch.setitem(schemas.MIGRATIONS, ("refund-agent", 1), v1_to_v2)
    monkeypatch.setitem(schemas.MIGRATIONS, ("refund-agent", 2), v2_to_v3)


def test_each_write_is_a_new_version_with_its_own_id_and_event(
    agent: ApiClient, run_id: str
) -> None:
    first = put(agent, run_id, BODY)
    assert first.status_code == 201, first.json()
    second = put(agent, run_id, {**BODY, "step_index": 3})
    assert second.status_code == 201
    one, two = first.json(), second.json()
    assert one["checkpoint_id"].startswith("ckpt_")
    assert (one["version"], two["version"]) == (1, 2)
    assert one["checkpoint_id"] != two["checkpoint_id"]
    assert [(e["checkpoint_id"], e["version"], e["step_index"]) for e in saved_events(run_id)] == [
        (one["checkpoint_id"], 1, 2),
        (two["checkpoint_id"], 2, 3),
    ]
    latest = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main").json()
    assert (latest["checkpoint_id"], latest["step_index"]) == (two["checkpoint_id"], 3)
    older = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main?version=1").json()
    assert (older["checkpoint_id"], older["step_index"]) == (one["checkpoint_id"], 2)
    versions = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main/versions").json()
    assert [v["checkpoint_id"] for v in versions] == [one["checkpoint_id"], two["checkpoint_id"]]


def test_the_same_body_again_answers_the_latest_version_and_writes_nothing(
    agent: ApiClient, run_id: str
) -> None:
    first = put(agent, run_id, BODY).json()
    again = put(agent, run_id, BODY)
    assert again.status_code == 200
    assert again.json()["checkpoint_id"] == first["checkpoint_id"]
    assert Checkpoint.objects.count() == 1
    assert len(saved_events(run_id)) == 1


def test_a_version_1_checkpoint_reads_back_migrated_to_version_3(
    agent: ApiClient, run_id: str, three_versions: None
) -> None:
    written = put(agent, run_id, BODY)
    assert written.status_code == 201
    read = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main").json()
    assert (read["schema_version"], read["written_schema_version"]) == (3, 1)
    assert read["state"] == "amount_decided"
    assert read["data"] == {"refund": {"amount_cents": 2500}, "legacy_note": "kept as it is"}
    assert read["input"] == BODY["input"] and read["budgets"] == BODY["budgets"]
    # At its own version it reads as written; the stored row never changes.
    as_written = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main?schema_version=1").json()
    assert as_written["data"] == BODY["data"] and as_written["schema_version"] == 1
    assert Checkpoint.objects.get().body["data"] == BODY["data"]
    # Part of the way: to v2.
    at_two = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main?schema_version=2").json()
    assert (at_two["state"], at_two["schema_version"]) == ("deciding_amount", 2)


def test_a_version_with_no_migration_path_is_refused_by_name(
    agent: ApiClient, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(schemas.MIGRATIONS, ("refund-agent", 2), lambda body: body)
    put(agent, run_id, BODY)  # v1: nothing registered from v1
    response = agent.get(f"/api/v1/runs/{run_id}/checkpoints/main")
    assert response.status_code == 409
    assert error_name(response) == "checkpoint.no_migration_path"
    assert "no migration from v1" in response.json()["error"]["message"]
    put(agent, run_id, {**BODY, "schema_version": 4}, name="newer")  # newer than the code
    response = agent.get(f"/api/v1/runs/{run_id}/checkpoints/newer")
    assert response.status_code == 409
    assert error_name(response) == "checkpoint.no_migration_path"


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("reasoning", {**BODY, "reasoning": "first I thought about the refund"}),
        ("data.chain_of_thought", {**BODY, "data": {"chain_of_thought": ["step 1"]}}),
        ("input.notes.0.Thoughts", {**BODY, "input": {"notes": [{"Thoughts": "hmm"}]}}),
    ],
)
def test_chain_of_thought_is_refused_with_a_named_422(
    agent: ApiClient, run_id: str, field: str, body: dict[str, Any]
) -> None:
    response = put(agent, run_id, body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["name"] == "checkpoint.chain_of_thought_refused"
    assert error["details"] == [{"field": field, "problem": "chain-of-thought is not stored"}]
    assert "decision" in error["message"]
    assert not Checkpoint.objects.exists() and saved_events(run_id) == []


def test_a_checkpoint_over_the_size_limit_is_a_named_413(
    agent: ApiClient, run_id: str, settings: Any
) -> None:
    settings.CHECKPOINT_MAX_BYTES = 2048
    response = put(agent, run_id, {**BODY, "data": {"copied_receipt": "x" * 3000}})
    assert response.status_code == 413
    assert error_name(response) == "checkpoint.too_large"
    assert not Checkpoint.objects.exists() and saved_events(run_id) == []


def test_it_refuses_ids_that_are_not_of_this_run(
    agent: ApiClient, run_id: str, sandbox: Sandbox
) -> None:
    elsewhere = propose(agent)  # a call in another run of the same tenant
    decision = agent.post(
        f"/api/v1/runs/{run_id}/decisions", {"kind": "eligibility", "content": {"ok": True}}
    ).json()
    body = {**BODY, "decision_ids": [decision["decision_id"]]}
    response = put(agent, run_id, {**body, "tool_call_ids": [elsewhere["tool_call_id"]]})
    assert response.status_code == 422
    assert error_name(response) == "checkpoint.foreign_reference"
    assert response.json()["error"]["details"][0]["field"] == "tool_call_ids"
    assert not Checkpoint.objects.exists()
    own = propose(agent, run_id=run_id, intent="own")
    response = put(agent, run_id, {**body, "tool_call_ids": [own["tool_call_id"]]})
    assert response.status_code == 201
    assert saved_events(run_id)[0]["tool_call_ids"] == [own["tool_call_id"]]


def test_a_finished_run_takes_no_checkpoint(agent: ApiClient, run_id: str) -> None:
    agent.post(f"/api/v1/runs/{run_id}/complete")
    response = put(agent, run_id, BODY)
    assert response.status_code == 409
    assert error_name(response) == "run.closed"


def test_another_tenant_neither_reads_nor_writes(
    agent: ApiClient, other_agent: ApiClient, run_id: str
) -> None:
    put(agent, run_id, BODY)
    assert put(other_agent, run_id, BODY).status_code == 404
    assert other_agent.get(f"/api/v1/runs/{run_id}/checkpoints/main").status_code == 404
    assert agent.get(f"/api/v1/runs/{run_id}/checkpoints/other").status_code == 404
    assert Checkpoint.objects.count() == 1


def test_the_database_refuses_to_rewrite_a_checkpoint(agent: ApiClient, run_id: str) -> None:
    checkpoint_id = put(agent, run_id, BODY).json()["checkpoint_id"]
    with pytest.raises(IntegrityError, match="written once"), transaction.atomic():
        Checkpoint.objects.filter(pk=checkpoint_id).update(body={"state": "rewritten"})
    assert Checkpoint.objects.get(pk=checkpoint_id).body["state"] == BODY["state"]


def test_rebuild_projections_finds_a_body_changed_behind_its_event(
    agent: ApiClient, run_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint_id = put(agent, run_id, BODY).json()["checkpoint_id"]
    call_command("rebuild_projections", "--verify")
    with connection.cursor() as cursor:  # what only a person at the database could do
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending checks: ALTER may run
        cursor.execute("ALTER TABLE memory_checkpoint DISABLE TRIGGER memory_checkpoint_no_update")
    Checkpoint.objects.filter(pk=checkpoint_id).update(body={**BODY, "step_index": 9})
    with pytest.raises(CommandError, match="1 differences"):
        call_command("rebuild_projections", "--verify")
    assert f"checkpoint {checkpoint_id}: body_digest" in capsys.readouterr().out
