"""Money written once (runs/money.py) for every layer that shows it: the console, the
approval e-mails and the chat messages; zero-decimal currencies count whole units."""

from __future__ import annotations

from console import formatting
from runs import money
from toolcalls import capabilities


def test_the_console_uses_the_one_formatter() -> None:
    assert formatting.money is money.money
    assert formatting.major_units_to_cents is money.major_units_to_cents


def test_a_yen_refund_is_written_in_whole_yen() -> None:
    refund = capabilities.get("refund-order-v2")
    args = {"order_id": "order-9", "amount_cents": 1500, "currency": "jpy"}
    assert refund.summary(args) == "Refund 1500 JPY on order order-9."
    assert money.summary_text(refund.summary(args), args) == "Refund ¥1,500 on order order-9."


def test_a_dollar_refund_keeps_its_stored_form_and_reads_as_money() -> None:
    refund = capabilities.get("refund-order-v2")
    args = {"order_id": "order-9", "amount_cents": 120000, "currency": "USD", "reason": "late"}
    stored = refund.summary(args)
    assert stored == "Refund 1200.00 USD on order order-9 (late)."
    assert money.summary_text(stored, args) == "Refund $1,200.00 on order order-9 (late)."


def test_yen_summaries_stored_before_the_fix_read_as_the_same_money() -> None:
    args = {"amount_cents": 1500, "currency": "JPY"}
    assert money.summary_text("Refund 15.00 JPY on order o.", args) == "Refund ¥1,500 on order o."


def test_what_it_cannot_match_stays_as_stored() -> None:
    stored = "Refund 1200.00 USD on order order-7."
    assert money.summary_text(stored, {}) == stored
    assert money.summary_text(stored, "not a dict") == stored
    assert money.summary_text(stored, {"amount_cents": "12", "currency": "USD"}) == stored
    assert money.summary_text(stored, {"amount_cents": True, "currency": "USD"}) == stored


def test_money_and_its_inputs() -> None:
    assert money.money(-120050, "usd") == "-$1,200.50"
    assert money.money(1500, "JPY") == "¥1,500"
    assert money.money(700, "CHF") == "7.00 CHF"
    assert money.major_units_to_cents("¥1,500", "JPY") == 1500
    assert money.cents_to_major_units(25000, "USD") == "250.00"
