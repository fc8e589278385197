"""A framework that replays its tool call after an approver edited it resubmits what its model
asked for: it gets the same call back (with what ran), not a conflict."""

from __future__ import annotations

import pytest

from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due

pytestmark = pytest.mark.django_db


def test_the_replayed_proposal_gets_the_edited_call_back(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND, intent="run-1:call_big")
    decide(logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000")
    run_due()
    again = propose(agent, BIG_REFUND, intent="run-1:call_big", run_id=call["run_id"], status=200)
    assert again["tool_call_id"] == call["tool_call_id"]
    assert (again["status"], again["edited"]) == ("succeeded", True)
    assert again["executed_args"]["amount_cents"] == 15000


def test_other_arguments_with_the_same_intent_are_still_a_conflict(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND, intent="run-1:call_big")
    decide(logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000")
    other = {**BIG_REFUND, "amount_cents": 20000}
    refused = propose(agent, other, intent="run-1:call_big", run_id=call["run_id"], status=409)
    assert refused["error"]["name"] == "idempotency.conflict"
