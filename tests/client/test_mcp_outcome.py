"""What the MCP server tells a model (countersign/mcp_outcome.py): the intent a call is
proposed under, the annotations of a capability's tool, and the text of each outcome."""

from __future__ import annotations

from typing import Any

from countersign.mcp_outcome import annotations_of, intent_for, outcome_text, waiting_message

from toolcalls import capabilities

ARGS = {"order_id": "order-003", "amount_cents": 25000, "currency": "USD"}


def envelope(status: str, **fields: Any) -> dict[str, Any]:
    """A tool call as the API answers it, with what the texts read."""
    return {
        "tool_call_id": "tc_123",
        "capability": "refund-order-v2",
        "status": status,
        "result": None,
        "executed_args": ARGS,
        "edited": False,
        "decision": None,
        "approval_url": None,
        "expires_at": None,
        "retry_after_s": None,
        "approval": None,
        "last_error": None,
        **fields,
    }


# --- the idempotency key ----------------------------------------------------------------------


def test_the_hosts_key_in_meta_is_the_intent() -> None:
    meta = {"io.countersign/idempotency-key": "toolu_01A9", "progressToken": 7}
    assert intent_for(meta, "run_1", "refund-order-v2", ARGS) == "toolu_01A9"
    assert intent_for({"idempotency_key": "call_abc"}, "run_1", "x", ARGS) == "call_abc"


def test_a_hosts_key_outside_the_apis_alphabet_still_names_one_intent() -> None:
    meta = {"idempotency_key": "order 3 / refund #1"}
    first = intent_for(meta, "run_1", "refund-order-v2", ARGS)
    assert first.startswith("mcp-meta:")
    assert first == intent_for(meta, "run_2", "refund-order-v2", {"other": 1})


def test_without_a_key_it_derives_one_from_run_tool_and_canonical_arguments() -> None:
    derived = intent_for(None, "run_1", "refund-order-v2", ARGS)
    assert derived.startswith("mcp:")
    reordered = dict(reversed(list(ARGS.items())))
    assert intent_for({}, "run_1", "refund-order-v2", reordered) == derived
    assert intent_for({"progressToken": 1}, "run_1", "refund-order-v2", ARGS) == derived
    assert intent_for(None, "run_2", "refund-order-v2", ARGS) != derived
    assert intent_for(None, "run_1", "other-tool", ARGS) != derived
    assert intent_for(None, "run_1", "refund-order-v2", {**ARGS, "amount_cents": 1}) != derived


# --- annotations from the contract ------------------------------------------------------------


def described(capability_id: str) -> dict[str, Any]:
    return capabilities.get(capability_id).describe()


def test_a_refund_is_a_destructive_open_world_write() -> None:
    hints = annotations_of(described("refund-order-v2"))
    assert hints["read_only_hint"] is False
    assert hints["destructive_hint"] is True
    assert hints["idempotent_hint"] is True
    assert hints["open_world_hint"] is True


def test_a_reservation_that_can_be_released_only_adds() -> None:
    assert annotations_of(described("reserve-stock-v1"))["destructive_hint"] is False


def test_a_read_is_read_only() -> None:
    assert annotations_of(described("get-order-v1"))["read_only_hint"] is True


# --- outcomes -----------------------------------------------------------------------------------


def test_an_unknown_outcome_says_do_not_retry() -> None:
    text, is_error = outcome_text(envelope("unknown"))
    assert "do not retry; being reconciled" in text.lower()
    assert 'countersign_status(call_id="tc_123")' in text
    assert is_error is False


def test_a_rejection_gives_who_and_the_reason() -> None:
    decision = {"outcome": "rejected", "by": ["alice"], "reason": "customer already refunded"}
    text, is_error = outcome_text(envelope("rejected", decision=decision))
    assert text.startswith("Rejected by alice: customer already refunded.")
    assert "was not executed" in text
    assert is_error is True


def test_the_pending_handle_says_not_to_reissue_and_how_to_check() -> None:
    approval = {"approvals": 0, "required_approvers": 2}
    call = envelope(
        "awaiting_approval",
        approval=approval,
        approval_url="http://cs.example/approvals/ap_1/",
        expires_at="2026-12-01T10:00:00Z",
    )
    text, is_error = outcome_text(call)
    assert "waiting for approval, 0 of 2" in text
    assert "http://cs.example/approvals/ap_1/" in text
    assert "Do not re-issue this call" in text
    assert 'countersign_status(call_id="tc_123", wait_s=20)' in text
    assert is_error is False
    assert waiting_message(call) == "waiting for approval, 0 of 2"


def test_an_edited_result_says_what_actually_ran() -> None:
    decision = {"outcome": "approved", "by": ["alice"], "reason": "half"}
    call = envelope(
        "succeeded",
        result={"amount_cents": 15000},
        executed_args={**ARGS, "amount_cents": 15000},
        edited=True,
        decision=decision,
    )
    text, is_error = outcome_text(call)
    assert "alice changed the arguments" in text
    assert '"amount_cents":15000' in text
    assert is_error is False


def test_failed_and_expired_are_errors() -> None:
    error = {"name": "tool.validation_failed", "message": "order-003 is not refundable"}
    text, is_error = outcome_text(envelope("failed", last_error=error))
    assert "tool.validation_failed: order-003 is not refundable" in text
    assert is_error is True
    text, is_error = outcome_text(envelope("expired"))
    assert text.startswith("Expired:") and is_error is True
