"""Hostile bodies on every JSON endpoint: a named 4xx in the API's error shape, nothing written.

Each body is otherwise what the endpoint takes, with one hostile value in one of its fields
(a run's title and metadata, a decision's kind and content, a stop or complete reason, a tool
call's arguments); the tool-call commands take no fields, and a body sent to them is parsed by
the same rules all the same.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from runs.models import Decision, Event, OutboxMessage, Run
from tests.conftest import ApiClient
from toolcalls.models import ToolCall

REFUND = {"order_id": "order-002", "amount_cents": 2500, "currency": "USD"}

# Each endpoint's body with `{v}` where a hostile value goes (a JSON fragment).
BODIES = {
    "runs": ("/api/v1/runs", '{{"title": {v}, "metadata": {{"note": {v}}}}}'),
    "decisions": (
        "/api/v1/runs/{run}/decisions",
        '{{"kind": {v}, "content": {{"eligible": true, "why": {v}}}}}',
    ),
    "stop": ("/api/v1/runs/{run}/stop", '{{"reason": {v}}}'),
    "complete": ("/api/v1/runs/{run}/complete", '{{"reason": {v}}}'),
    "tool-calls": (
        "/api/v1/runs/{run}/tool-calls",
        '{{"capability": "refund-order-v2", "intent": "i-2", "args": '
        '{{"order_id": "order-002", "amount_cents": 100, "currency": "USD", "reason": {v}}}}}',
    ),
    "retry": ("/api/v1/tool-calls/{call}/retry", '{{"note": {v}}}'),
    "reconcile": ("/api/v1/tool-calls/{call}/reconcile", '{{"note": {v}}}'),
    "compensate": ("/api/v1/tool-calls/{call}/compensate", '{{"note": {v}}}'),
}

STRING = ("request.invalid_string", 422)
NUMBER = ("request.number_out_of_range", 422)
# (JSON fragment, expected error name, expected status)
HOSTILE_VALUES = {
    "nul": ('"refund\\u0000order"', *STRING),
    "nul-in-a-key": ('{"ok\\u0000": 1}', *STRING),
    "lone-high-surrogate": ('"\\ud800"', *STRING),
    "lone-low-surrogate": ('"x\\udc00y"', *STRING),
    "surrogate-in-a-key": ('{"\\ud800": 1}', *STRING),
    "integer-above-2**53": ("9007199254740992", *NUMBER),
    "integer-below--2**53": ("-9007199254740992", *NUMBER),
    "integer-of-5000-digits": ("1" + "0" * 5000, *NUMBER),
    "float-1e300": ("1e300", *NUMBER),
    "float-overflowing-to-infinity": ("-1e400", *NUMBER),
    "NaN": ("NaN", *NUMBER),
    "Infinity": ("Infinity", *NUMBER),
    "nested-in-a-list": ('[1, 2, ["\\u0000"]]', *STRING),
    "duplicate-key": ('{"a": 1, "a": 2}', "request.duplicate_key", 400),
}


@pytest.fixture
def ids(agent: ApiClient, sandbox) -> dict[str, str]:
    run = agent.post("/api/v1/runs", {"title": "t"}).json()["run_id"]
    response = agent.post(
        f"/api/v1/runs/{run}/tool-calls",
        {"capability": "refund-order-v2", "args": REFUND, "intent": "i-1"},
    )
    assert response.status_code == 201, response.json()
    return {"run": run, "call": response.json()["tool_call_id"]}


def counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Run, Event, Decision, ToolCall, OutboxMessage)
    }


def send(agent: ApiClient, path: str, body: str, content_type: str | None = "application/json"):
    headers = {"Authorization": f"Bearer {agent.token}"}
    if content_type is None:
        # The test client always sends a Content-Type; a bare request sends none.
        return agent.client.generic("POST", path, body, content_type="", headers=headers)
    return agent.client.post(path, data=body, content_type=content_type, headers=headers)


def assert_refused(response, status: int, name: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json; charset=utf-8"
    error = response.json()["error"]
    assert error["name"] == name
    assert set(error) == {"name", "message", "details"}
    assert error["message"]


@pytest.mark.parametrize("endpoint", BODIES)
@pytest.mark.parametrize("hostile", HOSTILE_VALUES)
def test_a_hostile_value_is_refused_and_nothing_written(
    agent: ApiClient, ids: dict[str, str], endpoint: str, hostile: str
) -> None:
    path, template = BODIES[endpoint]
    value, name, status = HOSTILE_VALUES[hostile]
    before = counts()
    response = send(agent, path.format(**ids), template.format(v=value))
    assert_refused(response, status, name)
    assert counts() == before


@pytest.mark.parametrize("endpoint", BODIES)
@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_declared_json_is_refused(
    agent: ApiClient, ids: dict[str, str], endpoint: str, content_type: str | None
) -> None:
    path, template = BODIES[endpoint]
    before = counts()
    response = send(agent, path.format(**ids), template.format(v='"fine"'), content_type)
    assert_refused(response, 415, "request.unsupported_media_type")
    assert counts() == before


def test_a_duplicate_key_at_the_top_is_named(agent: ApiClient, db: None) -> None:
    response = send(agent, "/api/v1/runs", '{"title": "a", "title": "b"}')
    assert_refused(response, 400, "request.duplicate_key")
    assert "title" in response.json()["error"]["message"]
    assert counts()["Run"] == 0


def test_the_refusal_names_where_the_bad_value_is(agent: ApiClient, db: None) -> None:
    body = '{"title": "t", "metadata": {"lines": [{"amount": 1e300}]}}'
    response = send(agent, "/api/v1/runs", body)
    assert_refused(response, 422, "request.number_out_of_range")
    assert response.json()["error"]["details"][0]["field"] == "metadata.lines.0.amount"


def test_the_issue_body_is_refused(agent: ApiClient, db: None) -> None:
    # The body of issue #10: it answered 201 and broke verify_event_chain.
    response = agent.post("/api/v1/runs", {"title": "x", "metadata": {"x": 1e300}})
    assert_refused(response, 422, "request.number_out_of_range")
    assert counts()["Run"] == 0


@pytest.mark.parametrize(
    "deadline", [0, -1, "1970-01-01T00:00:00Z", "2020-01-01T00:00:00+00:00", "2020-01-01T00:00"]
)
def test_a_deadline_in_the_past_is_refused(agent: ApiClient, db: None, deadline) -> None:
    response = agent.post("/api/v1/runs", {"title": "t", "deadline": deadline})
    assert_refused(response, 422, "request.validation_failed")
    assert [d["field"] for d in response.json()["error"]["details"]] == ["deadline"]
    assert counts()["Run"] == 0


@pytest.mark.parametrize("deadline", ["2999-01-01T00:00:00Z", "2999-01-01T00:00:00"])
def test_a_deadline_in_the_future_is_taken(agent: ApiClient, db: None, deadline: str) -> None:
    response = agent.post("/api/v1/runs", {"title": "t", "deadline": deadline})
    assert response.status_code == 201, response.json()
    assert response.json()["deadline"] == "2999-01-01T00:00:00Z"


def test_what_canonical_json_carries_is_taken_and_verifies(agent: ApiClient, db: None) -> None:
    # The edges of what is allowed go in, come back unchanged, and the chain verifies.
    metadata = {
        "largest": 9007199254740991,
        "smallest": -9007199254740991,
        "fraction": 0.30000000000000004,
        "tiny": 5e-324,
        "big_float": 9007199254740991.0,
        "negative_zero": -0.0,
        "emoji": "\U0001f600 ok",
        "escaped_pair": "\ud83d\ude00",
    }
    body = json.dumps({"title": "t", "metadata": metadata})
    response = send(agent, "/api/v1/runs", body, "application/json; charset=utf-8")
    assert response.status_code == 201, response.json()
    assert Run.objects.get().metadata["largest"] == 9007199254740991
    call_command("verify_event_chain")


def test_an_empty_body_on_a_command_is_still_fine(agent: ApiClient, ids: dict[str, str]) -> None:
    # What a client sends for a command without fields: no body and no Content-Type.
    response = send(agent, f"/api/v1/runs/{ids['run']}/stop", "", content_type=None)
    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("depth", [65, 900, 5000])
def test_a_body_nested_too_deeply_is_refused(agent: ApiClient, db: None, depth: int) -> None:
    body = '{"title": "t", "metadata": {"a": ' + "[" * depth + "]" * depth + "}}"
    response = send(agent, "/api/v1/runs", body)
    assert response.status_code in (400, 422), response.content[:300]
    assert response.json()["error"]["name"] in ("request.too_deep", "request.malformed_json")
    assert counts()["Run"] == 0


def test_a_body_nested_to_the_limit_is_taken(agent: ApiClient, db: None) -> None:
    # The title's object is level 1, metadata level 2: 62 lists inside it reach 64.
    body = '{"title": "t", "metadata": {"a": ' + "[" * 62 + "]" * 62 + "}}"
    assert send(agent, "/api/v1/runs", body).status_code == 201


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runs/run_%00x",
        "/api/v1/runs/run_%00x/progress",
        "/api/v1/tool-calls/tc_%00x",
        "/api/v1/tool-calls/tc_x?wait=0&note=%00",
    ],
)
def test_a_nul_in_the_path_or_query_is_refused(agent: ApiClient, db: None, path: str) -> None:
    response = agent.get(path)
    assert_refused(response, 422, "request.invalid_string")


def test_a_nul_in_the_path_of_a_command_is_refused(agent: ApiClient, db: None) -> None:
    before = counts()
    response = send(agent, "/api/v1/runs/run_%00x/stop", '{"reason": "r"}')
    assert_refused(response, 422, "request.invalid_string")
    assert counts() == before
