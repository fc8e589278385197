"""GET /api/v1/eval-traces and the console export: one `countersign.eval_trace/1` record per
finished run, from the event log, valid against its JSON Schema, with no secret in it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.models import ApiKey, Tenant, User
from tests.helpers import (
    BIG_REFUND,
    ROOT,
    ApiClient,
    approval_of,
    decide,
    logged_in,
    make_user,
    propose,
    start_run,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls import dispatch
from toolcalls.connectors import SANDBOX_TOKENS
from toolcalls.models import ToolCall

SCHEMA = json.loads((ROOT / "docs" / "eval-trace.schema.json").read_text())
SMALL = {"order_id": "order-002", "amount_cents": 1000, "currency": "USD"}
LOST = {"order_id": "order-001", "amount_cents": 1500, "currency": "USD"}


@pytest.fixture
def eval_reader(agent: ApiClient) -> None:
    """The agent's key gets the eval:read scope, by name (`*` does not include it)."""
    ApiKey.objects.update(scopes=["*", "eval:read"])


@pytest.fixture
def carol(tenant: Tenant) -> User:
    """An approver whose username is her e-mail address, as some sites set them up."""
    return make_user("carol@acme.example", tenant, User.Role.APPROVER)


@pytest.fixture
def finished(
    agent: ApiClient, carol: User, approver: User, sandbox: Sandbox, settings: Any
) -> dict[str, str]:
    """Two finished runs and one still open. The first: a decision, a refund verified, a big
    refund that carol approved with a lower amount, a checkpoint, feedback from the agent and
    from alice; completed. The second: a refund whose response was lost; needs_human."""
    settings.EVAL_TRACE_SETTLE_SECONDS = 0
    # Credentials from server configuration, as production has them.
    settings.COUNTERSIGN_CONNECTORS = {
        "acme": {
            system: {"base_url": f"{sandbox.url}/{system}", "token": token}
            for system, token in SANDBOX_TOKENS.items()
        }
    }
    for user in User.objects.all():
        if "@" not in user.username:
            user.email = f"{user.username}.mail@acme.example"
            user.save(update_fields=["email"])

    first = start_run(agent, "refunds", max_tool_calls=5)
    decision = agent.post(
        f"/api/v1/runs/{first}/decisions", {"kind": "eligibility", "content": {"eligible": True}}
    ).json()
    small = propose(agent, SMALL, run_id=first, intent="small", decision_id=decision["decision_id"])
    run_due()
    big = propose(agent, BIG_REFUND, run_id=first, intent="big")
    response = decide(
        logged_in(carol), approval_of(big), "edit", edit__amount_cents="24000", reason="less"
    )
    assert response.status_code == 302
    run_due()
    agent.put(
        f"/api/v1/runs/{first}/checkpoints/main",
        {
            "schema_version": 1,
            "state": "done",
            "step_index": 2,
            "tool_call_ids": [small["tool_call_id"]],
        },
    )
    agent.post(f"/api/v1/runs/{first}/feedback", {"tool_call_id": big["tool_call_id"], "rating": 4})
    assert agent.post(f"/api/v1/runs/{first}/complete").json()["state"] == "completed"
    logged_in(approver).post(
        f"/approvals/{approval_of(big).pk}/feedback/", {"label": "good_edit", "text": "fair"}
    )

    second = start_run(agent, "lost refund")
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    lost = propose(agent, LOST, run_id=second, intent="lost")
    dispatch.tool_call_dispatch(tool_call_id=lost["tool_call_id"])
    assert agent.post(f"/api/v1/runs/{second}/complete").json()["state"] == "needs_human"

    start_run(agent, "still open")
    return {
        "first": first,
        "second": second,
        "small": small["tool_call_id"],
        "big": big["tool_call_id"],
    }


def read(agent: ApiClient, query: str = "") -> tuple[Any, list[dict[str, Any]]]:
    response = agent.get(f"/api/v1/eval-traces{query}")
    assert response.status_code == 200, response.content
    text = b"".join(response.streaming_content).decode()
    return text, [json.loads(line) for line in text.splitlines()]


def test_a_key_without_eval_read_is_refused(agent: ApiClient) -> None:
    response = agent.get("/api/v1/eval-traces")
    assert response.status_code == 403
    assert response.json()["error"]["name"] == "eval.forbidden"


def test_each_finished_run_has_one_record_valid_against_its_schema(
    agent: ApiClient, finished: dict[str, str], eval_reader: None
) -> None:
    _text, records = read(agent)
    assert [r["run_id"] for r in records] == [finished["first"], finished["second"]]
    validator = jsonschema.Draft202012Validator(
        SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for trace in records:
        assert sorted(e.message for e in validator.iter_errors(trace)) == []

    first, second = records
    assert first["schema"] == "countersign.eval_trace/1"
    assert first["exit"] == {"type": "completed", "reason": ""}
    assert [d["kind"] for d in first["decisions"]] == ["eligibility"]
    calls = {c["tool_call_id"]: c for c in first["tool_calls"]}
    small, big = calls[finished["small"]], calls[finished["big"]]
    assert (small["execution"]["status"], small["verification"]["status"]) == (
        "completed",
        "confirmed_success",
    )
    assert small["decision_id"] == first["decisions"][0]["decision_id"]
    assert big["args"]["amount_cents"] == 24000 and big["external_id"].startswith("re_")
    assert big["edits"][0]["diff"] == {"amount_cents": {"from": 25000, "to": 24000}}
    assert big["edits"][0]["by"] == "person"
    edited, approved = first["approvals"]
    assert (edited["state"], approved["state"]) == ("invalidated", "consumed")
    assert edited["decisions"][0]["decision"] == "approve_with_edits"
    assert edited["decisions"][0]["approver"] == approved["decisions"][0]["approver"] == 1
    assert edited["history"][0]["reason"] == "arguments edited by person 1"
    assert [(f["about"]["kind"], f["by"]) for f in first["feedback"]] == [
        ("tool_call", "agent"),
        ("approval", "person"),
    ]
    assert [c["state"] for c in first["checkpoints"]] == ["done"]
    assert first["budgets"]["tool_calls"] == {"max": 5, "used": 2}
    assert first["budgets"]["attempts"]["used"] == 2

    assert second["exit"]["type"] == "needs_human"
    [lost] = second["tool_calls"]
    assert lost["execution"]["status"] == "result_unknown"
    assert lost["execution"]["history"][-1]["error_name"] == "tool.connection_lost"


def test_no_credential_and_no_e_mail_address_is_in_it(
    agent: ApiClient, finished: dict[str, str], eval_reader: None, settings: Any
) -> None:
    text, records = read(agent)
    assert len(records) == 2
    secrets = set(SANDBOX_TOKENS.values())
    secrets |= {
        c["token"] for systems in settings.COUNTERSIGN_CONNECTORS.values() for c in systems.values()
    }
    secrets |= {agent.token, agent.token.partition(".")[2], agent.key.secret_hash}
    people = list(User.objects.all())
    secrets |= {user.email for user in people if user.email}
    secrets |= {user.username for user in people if "@" in user.username}
    assert len(secrets) >= 10
    assert [secret for secret in secrets if secret in text] == []
    assert "user:" not in text and "api_key:" not in text  # people and keys are not named


def test_since_gives_runs_that_changed_from_then_and_feedback_brings_a_run_back(
    agent: ApiClient, finished: dict[str, str], eval_reader: None
) -> None:
    _text, records = read(agent)
    last = records[-1]["last_event_at"]
    _text, again = read(agent, f"?since={last.replace('+00:00', 'Z')}")
    assert [r["run_id"] for r in again] == [finished["second"]]  # at `since`: comes again
    agent.post(f"/api/v1/runs/{finished['first']}/feedback", {"label": "late_thought"})
    _text, again = read(agent, f"?since={last.replace('+00:00', 'Z')}")
    assert [r["run_id"] for r in again] == [finished["second"], finished["first"]]
    assert again[-1]["feedback"][-1]["label"] == "late_thought"


def test_runs_finished_within_the_settle_window_wait_for_the_next_read(
    agent: ApiClient, eval_reader: None, settings: Any
) -> None:
    settings.EVAL_TRACE_SETTLE_SECONDS = 60
    run_id = start_run(agent)
    agent.post(f"/api/v1/runs/{run_id}/complete")
    assert read(agent)[1] == []
    settings.EVAL_TRACE_SETTLE_SECONDS = 0
    assert [r["run_id"] for r in read(agent)[1]] == [run_id]


def test_tenant_admins_export_them_and_others_may_not(
    agent: ApiClient,
    finished: dict[str, str],
    admin_user: User,
    approver: User,
    other_tenant: Tenant,
) -> None:
    assert 'href="/eval-traces/export/"' in logged_in(admin_user).get("/audit/").content.decode()
    response = logged_in(admin_user).get("/eval-traces/export/")
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith('attachment; filename="eval-traces-acme-')
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == [finished["first"], finished["second"]]
    assert logged_in(approver).get("/eval-traces/export/").status_code == 403
    outsider = logged_in(make_user("mallory", other_tenant, User.Role.ADMIN))
    assert b"".join(outsider.get("/eval-traces/export/").streaming_content) == b""
    assert logged_in(admin_user).get("/eval-traces/export/?since=yesterday").status_code == 400


def test_rebuild_projections_compares_the_traces_with_the_state_tables(
    finished: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("rebuild_projections", "--verify")
    assert "eval_trace" in capsys.readouterr().out
    # A row changed behind the log's back: the trace (from the log) no longer agrees.
    ToolCall.objects.filter(pk=finished["small"]).update(execution_status="failed")
    with pytest.raises(CommandError):
        call_command("rebuild_projections", "--verify")
    out = capsys.readouterr().out
    assert f"eval_trace {finished['first']}: tool_calls stored=" in out


def test_eval_read_is_a_scope_a_key_is_issued_with_by_name(tenant: Tenant) -> None:
    from runs.services import api_key_issue

    key, _ = api_key_issue(tenant=tenant, name="evaluator", scopes=["eval:read"])
    assert key.scopes == ["eval:read"]
    everything, _ = api_key_issue(tenant=tenant, name="agent", scopes=["*"])
    from memory.eval_trace import key_may_read

    assert key_may_read(key) and not key_may_read(everything)
