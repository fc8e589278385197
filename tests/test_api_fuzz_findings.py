"""What building the API fuzz test (tests/test_api_fuzz.py) found, each with the exact request:
server errors from probing the inputs it reaches — headers, the bearer token, time zone
offsets — and times the document says are ISO 8601 strings but were also read as numbers.
Each is a named 4xx in the API's error shape now, and nothing is written."""

from __future__ import annotations

from django.test import Client

from runs.models import Event, Run
from tests.helpers import ApiClient, propose


def assert_refused(response, status: int, name: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response.json()["error"]["name"] == name


def test_a_nul_in_the_key_id_of_the_bearer_token_is_unauthenticated(agent: ApiClient) -> None:
    # Was a 500: the key id went into a database query, which cannot carry a NUL.
    response = Client().get("/api/v1/capabilities", headers={"Authorization": "Bearer key_\x00.x"})
    assert_refused(response, 401, "auth.unauthenticated")


def test_a_nul_in_the_idempotency_key_header_is_refused(agent: ApiClient) -> None:
    # Was a 500: the header's value went into a database query.
    response = agent.post("/api/v1/runs", {"title": "x"}, headers={"Idempotency-Key": "a\x00b"})
    assert_refused(response, 422, "request.invalid_string")
    assert response.json()["error"]["details"][0]["field"] == "header.Idempotency-Key"
    assert Run.objects.count() == Event.objects.count() == 0


def test_a_deadline_past_the_calendar_in_utc_is_refused(agent: ApiClient) -> None:
    # Was a 500: 9999-12-31T23:59:59-23:59 is in the year 10000 in UTC (OverflowError).
    response = agent.post("/api/v1/runs", {"title": "x", "deadline": "9999-12-31T23:59:59-23:59"})
    assert_refused(response, 422, "request.validation_failed")
    assert [d["field"] for d in response.json()["error"]["details"]] == ["deadline"]
    assert Run.objects.count() == 0


def test_a_deadline_given_as_a_number_is_refused(agent: ApiClient) -> None:
    # The document says an ISO 8601 date-time string; 4102444800 was read as Unix seconds (2100).
    response = agent.post("/api/v1/runs", {"title": "x", "deadline": 4102444800})
    assert_refused(response, 422, "request.validation_failed")
    assert [d["field"] for d in response.json()["error"]["details"]] == ["deadline"]
    assert Run.objects.count() == 0


def test_since_given_as_a_number_is_refused(agent: ApiClient, sandbox) -> None:
    # The document says an ISO 8601 date-time; `since=9` was read as 9 seconds after 1970.
    call = propose(agent)
    response = agent.get(f"/api/v1/tool-calls/{call['tool_call_id']}?since=9")
    assert_refused(response, 422, "request.validation_failed")
    assert [d["field"] for d in response.json()["error"]["details"]] == ["query.since"]


def test_two_response_schemas_never_share_a_name() -> None:
    """django-ninja names a component by its class: a second `DecisionOut` (the envelope's
    approval decision) silently replaced the decision record's in the document."""
    from config.api import api

    components = api.get_openapi_schema()["components"]["schemas"]
    assert "decision_id" in components["DecisionOut"]["properties"]
    assert "outcome" in components["ApprovalDecisionOut"]["properties"]
