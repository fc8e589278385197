"""An approver's edit replaces a call's arguments in place. The agent that proposed it,
replaying its proposal with the arguments it sent (a framework re-running a node after a
resume, an MCP host asking again), gets the same call back — not 409 — with what actually
runs; other arguments under the same intent are still a conflict."""

from __future__ import annotations

from runs.models import User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, decide, logged_in, propose, start_run


def test_a_replay_with_the_proposed_arguments_gets_the_edited_call(
    agent: ApiClient, approver: User, sandbox
) -> None:
    run_id = start_run(agent)
    call = propose(agent, BIG_REFUND, run_id=run_id, intent="call_big")
    decide(
        logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000", reason="half"
    )
    again = propose(agent, BIG_REFUND, run_id=run_id, intent="call_big", status=200)
    assert again["tool_call_id"] == call["tool_call_id"]
    assert again["edited"] is True
    assert again["executed_args"]["amount_cents"] == 15000


def test_other_arguments_under_the_intent_are_still_a_conflict(
    agent: ApiClient, approver: User, sandbox
) -> None:
    run_id = start_run(agent)
    call = propose(agent, BIG_REFUND, run_id=run_id, intent="call_big")
    decide(
        logged_in(approver), approval_of(call), "edit", edit__amount_cents="15000", reason="half"
    )
    other = {**BIG_REFUND, "amount_cents": 24000}
    refusal = propose(agent, other, run_id=run_id, intent="call_big", status=409)
    assert refusal["error"]["name"] == "idempotency.conflict"
