"""A framework that replays its node after an approver edited the call sends the arguments it
proposed again, with the same intent: it gets the same call back, edited — not a conflict, and
never a second call."""

from __future__ import annotations

from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall


def test_the_proposed_args_again_after_an_edit_give_the_edited_call(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND, intent="thread-1:call_1")
    decide(logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000", reason="x")

    again = propose(agent, BIG_REFUND, intent="thread-1:call_1", run_id=call["run_id"], status=200)

    assert again["tool_call_id"] == call["tool_call_id"]
    assert (again["edited"], again["executed_args"]["amount_cents"]) == (True, 15000)
    assert ToolCall.objects.count() == 1


def test_other_args_with_the_same_intent_are_still_a_conflict_after_an_edit(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND, intent="thread-1:call_1")
    decide(logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000", reason="x")
    other = {**BIG_REFUND, "amount_cents": 24000}

    refused = propose(agent, other, intent="thread-1:call_1", run_id=call["run_id"], status=409)

    assert refused["error"]["name"] == "idempotency.conflict"
