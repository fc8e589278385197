"""POST /api/v1/runs/{id}/tool-calls and the capability catalogue."""

from __future__ import annotations

import jsonschema
import pytest

from runs.models import Event, OutboxMessage
from tests.helpers import ApiClient, propose, start_run
from tests.sandbox_process import Sandbox
from toolcalls import capabilities
from toolcalls.capabilities import TrustedData
from toolcalls.models import ToolCall

REFUND = {"order_id": "order-001", "amount_cents": 1500, "currency": "USD", "reason": "damaged"}


@pytest.fixture
def run_id(agent: ApiClient) -> str:
    return start_run(agent, "Refund order-001")


def test_it_lists_every_capability_with_a_strict_schema(agent: ApiClient, sandbox) -> None:
    listed = {c["id"]: c for c in agent.get("/api/v1/capabilities").json()}
    assert set(listed) >= {
        "get-order-v1",
        "check-warranty-v1",
        "refund-order-v2",
        "reserve-stock-v1",
        "release-stock-v1",
        "create-waybill-v1",
        "cancel-waybill-v1",
        "send-email-v1",
    }
    assert listed["reserve-stock-v1"]["compensation"] == "release-stock-v1"
    assert listed["create-waybill-v1"]["compensation"] == "cancel-waybill-v1"
    assert listed["send-email-v1"]["irreversible"] is True
    assert listed["create-waybill-v1"]["remote_dedupe_window_seconds"] is None
    for capability in listed.values():
        assert capability["input_schema"]["additionalProperties"] is False


@pytest.mark.parametrize("capability_id", sorted(capabilities.REGISTRY))
def test_each_example_is_valid_against_the_seeded_sandbox(capability_id: str, sandbox) -> None:
    capability = capabilities.get(capability_id)
    (example,) = capability.input_schema["examples"]
    jsonschema.validate(example, capability.input_schema)
    assert capability.business_check(TrustedData("acme"), example) == []


def test_it_proposes_and_authorizes_a_call(agent: ApiClient, run_id: str, sandbox) -> None:
    decision_id = agent.post(
        f"/api/v1/runs/{run_id}/decisions", {"kind": "refund_eligibility", "content": {}}
    ).json()["decision_id"]
    body = propose(
        agent,
        REFUND,
        run_id=run_id,
        intent="intent-031",
        decision_id=decision_id,
        object={"ref": "order:order-001", "revision": 1},
        status=201,
    )
    assert body["tool_call_id"].startswith("tc_")
    assert body["idempotency_key"] == "acme:order:order-001:refund:intent-031"
    assert body["execution_status"] == "authorized"
    assert body["verification_status"] == "not_observed"
    assert body["approval"] is None
    assert body["decision_id"] == decision_id
    types = list(
        Event.objects.filter(tool_call_id=body["tool_call_id"]).values_list("event_type", flat=True)
    )
    assert types == ["tool_call.proposed", "tool_call.authorized"]
    # Dispatch is enqueued through the outbox, in the same transaction.
    assert (
        OutboxMessage.objects.filter(task="toolcalls.dispatch", args=[body["tool_call_id"]]).count()
        == 1
    )


def test_the_same_intent_and_args_return_the_same_call(agent: ApiClient, run_id: str, sandbox):
    first = propose(agent, REFUND, run_id=run_id, status=201)
    again = propose(agent, dict(reversed(list(REFUND.items()))), run_id=run_id, status=200)
    assert again["tool_call_id"] == first["tool_call_id"]
    assert ToolCall.objects.count() == 1


def test_the_same_intent_in_a_new_run_is_still_the_same_operation(
    agent: ApiClient, run_id: str, sandbox
) -> None:
    first = propose(agent, REFUND, run_id=run_id)
    other_run = start_run(agent, "agent restarted")
    again = propose(agent, REFUND, run_id=other_run, status=200)
    assert again["tool_call_id"] == first["tool_call_id"]


def test_the_same_intent_with_other_args_is_a_conflict(agent: ApiClient, run_id: str, sandbox):
    propose(agent, REFUND, run_id=run_id)
    refused = propose(agent, {**REFUND, "amount_cents": 1600}, run_id=run_id, status=409)
    assert refused["error"]["name"] == "idempotency.conflict"
    assert ToolCall.objects.count() == 1


def test_another_intent_is_another_operation(agent: ApiClient, run_id: str, sandbox) -> None:
    propose(agent, REFUND, run_id=run_id, intent="intent-031")
    propose(agent, REFUND, run_id=run_id, intent="intent-032", status=201)
    assert ToolCall.objects.count() == 2


@pytest.mark.parametrize(
    ("args", "fields"),
    [
        ({**REFUND, "amount_cents": "lots"}, {"args.amount_cents"}),
        ({**REFUND, "api_token": "x"}, {"args"}),
        ({"order_id": "order-001"}, {"args"}),
        ({**REFUND, "amount_cents": 999_999}, {"args.amount_cents"}),
        ({**REFUND, "currency": "EUR"}, {"args.currency"}),
        ({**REFUND, "order_id": "order-016"}, {"args.order_id"}),  # globex's order
    ],
)
def test_it_refuses_bad_args_naming_each_field(
    agent: ApiClient, run_id: str, sandbox, args: dict, fields: set
) -> None:
    events_before = Event.objects.count()
    error = propose(agent, args, run_id=run_id, status=422)["error"]
    assert error["name"] == "tool.validation_failed"
    assert {d["field"] for d in error["details"]} == fields
    assert ToolCall.objects.count() == 0
    assert Event.objects.count() == events_before


def test_it_answers_503_when_the_check_cannot_reach_the_system(
    agent: ApiClient, run_id: str, sandbox: Sandbox
) -> None:
    events_before = Event.objects.count()
    sandbox.stop()  # the payment system is down: the order cannot be read
    refused = propose(agent, REFUND, run_id=run_id, status=503)
    assert refused["error"]["name"] == "tool.check_unavailable"
    assert "Try again" in refused["error"]["message"]
    assert ToolCall.objects.count() == 0
    assert Event.objects.count() == events_before
    assert not OutboxMessage.objects.filter(task="toolcalls.dispatch").exists()


def test_it_refuses_an_unknown_capability(agent: ApiClient, run_id: str, sandbox) -> None:
    refused = propose(
        agent, {}, capability="launch-rockets-v1", intent="i", run_id=run_id, status=422
    )
    assert refused["error"]["details"][0]["field"] == "capability"


def test_it_refuses_an_object_the_args_do_not_act_on(agent: ApiClient, run_id: str, sandbox):
    refused = propose(agent, REFUND, run_id=run_id, object={"ref": "order:order-002"}, status=422)
    assert refused["error"]["details"][0]["field"] == "object.ref"


def test_it_refuses_a_stale_object_revision(agent: ApiClient, run_id: str, sandbox) -> None:
    propose(agent, REFUND, run_id=run_id, object={"ref": "order:order-001", "revision": 3})
    refused = propose(
        agent,
        REFUND,
        run_id=run_id,
        intent="intent-040",
        object={"ref": "order:order-001", "revision": 2},
        status=409,
    )
    assert refused["error"]["name"] == "precondition.conflict"


def test_it_stops_at_the_runs_tool_call_budget(agent: ApiClient, sandbox) -> None:
    run_id = start_run(agent, "t", max_tool_calls=1)
    propose(agent, REFUND, run_id=run_id, intent="a", status=201)
    refused = propose(agent, REFUND, run_id=run_id, intent="b", status=409)
    assert refused["error"]["name"] == "flow.max_steps_exceeded"


def test_another_tenant_cannot_see_or_command_a_call(
    agent: ApiClient, other_agent: ApiClient, run_id: str, sandbox
) -> None:
    call_id = propose(agent, REFUND, run_id=run_id)["tool_call_id"]
    propose(other_agent, REFUND, run_id=run_id, status=404)
    for response in (
        other_agent.get(f"/api/v1/tool-calls/{call_id}"),
        other_agent.post(f"/api/v1/tool-calls/{call_id}/retry"),
        other_agent.post(f"/api/v1/tool-calls/{call_id}/reconcile"),
        other_agent.post(f"/api/v1/tool-calls/{call_id}/compensate"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["name"] == "resource.not_found"


def test_a_stopped_run_cancels_its_undispatched_calls(agent: ApiClient, run_id: str, sandbox):
    call_id = propose(agent, REFUND, run_id=run_id)["tool_call_id"]
    stopped = agent.post(f"/api/v1/runs/{run_id}/stop", {"reason": "customer withdrew"})
    assert stopped.status_code == 200
    assert stopped.json()["in_flight"] == []
    assert ToolCall.objects.get(pk=call_id).execution_status == "cancelled"
    late = propose(agent, REFUND, run_id=run_id, intent="late", status=409)
    assert late["error"]["name"] == "run.closed"


# --- the key an agent framework already has, as the intent ----------------------------------

FRAMEWORK_IDS = [
    "call_abc123",  # OpenAI (Chat Completions, Responses, the Agents SDK)
    "toolu_01A09q90qw90lq917835lq9",  # Anthropic
    # LangGraph: thread id, run id, tool-call id
    "9f1c2b7e-5d3a-4c1e-8f2a-1b2c3d4e5f60:1ef8b6a4-2c3d-6e7f-8a9b-0c1d2e3f4a5b:call_XyZ987",
    "x" * 200,
]


@pytest.mark.parametrize("intent", FRAMEWORK_IDS)
def test_a_frameworks_tool_call_id_is_the_intent(
    agent: ApiClient, run_id: str, sandbox: Sandbox, intent: str
) -> None:
    first = propose(agent, REFUND, run_id=run_id, intent=intent, status=201)
    response = agent.post(
        f"/api/v1/runs/{run_id}/tool-calls",
        {"capability": "refund-order-v2", "args": REFUND, "intent": intent},
    )
    # A framework that replays the node proposes again and gets the same call back.
    assert response.status_code == 200
    assert response.headers["Idempotent-Replayed"] == "true"
    assert response.json()["tool_call_id"] == first["tool_call_id"]
    assert response.json()["intent"] == intent
    assert ToolCall.objects.count() == 1


def test_an_intent_over_200_characters_is_refused(
    agent: ApiClient, run_id: str, sandbox: Sandbox
) -> None:
    error = propose(agent, REFUND, run_id=run_id, intent="x" * 201, status=422)["error"]
    assert [d["field"] for d in error["details"]] == ["intent"]
