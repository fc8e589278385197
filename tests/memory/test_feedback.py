"""Feedback facts: POST /api/v1/runs/{id}/feedback and the forms on the run and approval
pages. A fact of its own kind: it changes no runtime state."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from approvals.models import Approval, ApprovalDecision
from memory.models import Feedback
from runs.models import Event, OutboxMessage, Run, Tenant, User
from tests.helpers import (
    BIG_REFUND,
    ApiClient,
    approval_of,
    logged_in,
    make_user,
    propose,
    start_run,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls.models import Attempt, Receipt, ToolCall

SMALL = {"order_id": "order-002", "amount_cents": 1000, "currency": "USD"}


@pytest.fixture
def world(agent: ApiClient, sandbox: Sandbox) -> dict[str, Any]:
    """A run with a decision, a verified refund and a refund waiting for an approver."""
    run_id = start_run(agent, "refunds", max_tool_calls=5)
    decision = agent.post(
        f"/api/v1/runs/{run_id}/decisions", {"kind": "eligibility", "content": {"ok": True}}
    ).json()
    done = propose(agent, SMALL, run_id=run_id, intent="small")
    run_due()
    waiting = propose(agent, BIG_REFUND, run_id=run_id, intent="big")
    return {
        "run_id": run_id,
        "decision_id": decision["decision_id"],
        "done": done["tool_call_id"],
        "approval": approval_of(waiting),
    }


def runtime_state() -> dict[str, Any]:
    """Every row of the runtime, as stored (updated_at included)."""
    return {
        "runs": list(Run.objects.order_by("id").values()),
        "tool_calls": list(ToolCall.objects.order_by("id").values()),
        "approvals": list(Approval.objects.order_by("id").values()),
        "decisions": list(ApprovalDecision.objects.order_by("id").values()),
        "attempts": list(Attempt.objects.order_by("id").values()),
        "receipts": list(Receipt.objects.order_by("id").values()),
        "outbox": list(OutboxMessage.objects.order_by("id").values()),
    }


def test_a_feedback_fact_changes_no_runtime_state(
    agent: ApiClient, approver: User, world: dict[str, Any]
) -> None:
    run_id, approval = world["run_id"], world["approval"]
    before = runtime_state()
    last_seq = Event.objects.filter(run_id=run_id).order_by("-seq").first().seq

    answers = [
        agent.post(f"/api/v1/runs/{run_id}/feedback", body)
        for body in (
            {"rating": 2, "text": "slow"},
            {"decision_id": world["decision_id"], "label": "correct"},
            {"tool_call_id": world["done"], "rating": 5, "label": "right_amount"},
            {"approval_id": approval.pk, "label": "should_not_have_asked"},
        )
    ]
    person = logged_in(approver)
    person.post(f"/runs/{run_id}/feedback/", {"about": f"tool_call:{world['done']}", "rating": "4"})
    person.post(f"/approvals/{approval.pk}/feedback/", {"label": "Clear summary", "text": "ok"})

    assert [answer.status_code for answer in answers] == [201] * 4
    assert runtime_state() == before
    added = Event.objects.filter(run_id=run_id, seq__gt=last_seq).order_by("seq")
    assert [event.event_type for event in added] == ["feedback.recorded"] * 6
    facts = list(Feedback.objects.order_by("id"))
    assert [(f.subject_kind, f.subject_id) for f in facts] == [
        ("run", run_id),
        ("decision", world["decision_id"]),
        ("tool_call", world["done"]),
        ("approval", approval.pk),
        ("tool_call", world["done"]),
        ("approval", approval.pk),
    ]
    assert all(f.id.startswith("fb_") for f in facts)
    assert [e.payload["feedback_id"] for e in added] == [f.id for f in facts]
    assert (facts[0].actor, facts[0].api_key_id) == (f"api_key:{agent.key.pk}", agent.key.pk)
    assert (facts[5].actor, facts[5].user, facts[5].label) == (
        "user:alice",
        approver,
        "clear_summary",
    )
    assert answers[2].json()["given_by"] == f"api_key:{agent.key.pk}"
    call_command("rebuild_projections", "--verify")


def test_it_refuses_a_subject_of_another_run(agent: ApiClient, world: dict[str, Any]) -> None:
    other_run = start_run(agent, "another")
    for subject in (
        {"tool_call_id": world["done"]},
        {"decision_id": world["decision_id"]},
        {"approval_id": world["approval"].pk},
    ):
        response = agent.post(f"/api/v1/runs/{other_run}/feedback", {**subject, "rating": 1})
        assert response.status_code == 422
        assert response.json()["error"]["name"] == "feedback.subject_not_in_run"
    assert not Feedback.objects.exists()
    assert not Event.objects.filter(event_type="feedback.recorded").exists()


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ({"text": "no rating, no label"}, "feedback.empty"),
        ({"rating": 6}, "request.validation_failed"),
        ({"label": "Not A Label"}, "request.validation_failed"),
        (
            {"rating": 3, "tool_call_id": "tc_x", "approval_id": "apr_x"},
            "request.validation_failed",
        ),
    ],
)
def test_it_refuses_feedback_it_cannot_file(
    agent: ApiClient, body: dict[str, Any], name: str
) -> None:
    run_id = start_run(agent)
    response = agent.post(f"/api/v1/runs/{run_id}/feedback", body)
    assert response.status_code == 422
    assert response.json()["error"]["name"] == name
    assert not Feedback.objects.exists()


def test_a_finished_run_still_takes_feedback(agent: ApiClient) -> None:
    run_id = start_run(agent)
    agent.post(f"/api/v1/runs/{run_id}/complete")
    response = agent.post(f"/api/v1/runs/{run_id}/feedback", {"rating": 4})
    assert response.status_code == 201
    assert Run.objects.get(pk=run_id).state == "completed"


def test_another_tenant_can_neither_give_nor_see_it(
    agent: ApiClient, other_agent: ApiClient, other_tenant: Tenant, world: dict[str, Any]
) -> None:
    run_id = world["run_id"]
    assert other_agent.post(f"/api/v1/runs/{run_id}/feedback", {"rating": 1}).status_code == 404
    outsider = logged_in(make_user("mallory", other_tenant, User.Role.ADMIN))
    assert outsider.post(f"/runs/{run_id}/feedback/", {"rating": "1"}).status_code == 404
    approval_page = f"/approvals/{world['approval'].pk}/feedback/"
    assert outsider.post(approval_page, {"rating": "1"}).status_code == 404
    assert not Feedback.objects.exists()


def test_the_pages_show_the_form_and_what_was_said(
    viewer: User, world: dict[str, Any], agent: ApiClient
) -> None:
    person = logged_in(viewer)
    run_page = f"/runs/{world['run_id']}/"
    assert person.get(f"/runs/{world['run_id']}/feedback/").status_code == 405
    response = person.post(f"{run_page}feedback/", {"about": "run", "text": "no rating"})
    assert response.status_code == 302
    page = person.get(run_page).content.decode()
    assert "Give a rating (1 to 5) or a label" in page  # the refusal, as a message
    person.post(f"{run_page}feedback/", {"about": "run", "rating": "3", "text": "fine overall"})
    page = person.get(run_page).content.decode()
    assert 'action="/runs/' in page and "fine overall" in page and "by user:victor" in page
    approval_page = person.get(f"/approvals/{world['approval'].pk}/").content.decode()
    assert f'action="/approvals/{world["approval"].pk}/feedback/"' in approval_page
