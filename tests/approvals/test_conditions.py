from __future__ import annotations

import pytest

from approvals.conditions import ConditionError, evaluate, parse

ARGS = {"amount_cents": 25000, "currency": "USD", "sku": "PART-300", "address": {"country": "DE"}}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("amount_cents > 20000", True),
        ("amount_cents > 100000", False),
        ("amount_cents > 20000 and currency == 'USD'", True),
        ("amount_cents > 100000 or sku in ['PART-300', 'PART-400']", True),
        ("not currency == 'USD'", False),
        ("address.country != 'US'", True),
        ("20000 < amount_cents <= 30000", True),
        ("missing_field > 1", False),
        ("currency > 3", False),  # not comparable: no match, no crash
        ("amount_cents >= -1", True),
    ],
)
def test_it_evaluates_conditions(condition: str, expected: bool) -> None:
    assert evaluate(condition, ARGS) is expected


@pytest.mark.parametrize(
    "condition",
    [
        "__import__('os').system('true')",
        "amount_cents.__class__",
        "open('/etc/passwd')",
        "[x for x in range(10)]",
        "amount_cents + 1 > 2",
        "lambda: 1",
        "amount_cents >",
    ],
)
def test_it_refuses_anything_but_comparisons(condition: str) -> None:
    with pytest.raises(ConditionError):
        parse(condition)
