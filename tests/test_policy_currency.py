"""Rule sentences write amounts in the currency the rule fixes (`currency == "EUR"` beside
the amount, or a schema that allows one currency); a rule that fixes none says the number is
compared in whatever currency the call has, instead of printing dollars."""

from __future__ import annotations

from django.test import Client

from approvals.models import Policy
from console import policy_text
from runs.models import Tenant, User
from tests.helpers import logged_in
from toolcalls import capabilities

REFUND = "refund-order-v2"


def words(condition: str) -> str:
    return policy_text.condition_words(condition, REFUND)


def test_an_amount_beside_a_currency_is_money_of_that_currency() -> None:
    assert words('amount_cents > 100000 and currency == "EUR"') == (
        "amount over €1,000.00 and currency is “EUR”"
    )
    assert words('currency in ["GBP"] and (amount_cents > 5000 or reason == "x")') == (
        "currency is one of “GBP” and (amount over £50.00 or reason is “x”)"
    )


def test_a_rule_that_does_not_fix_the_currency_says_so() -> None:
    assert words("amount_cents > 20000") == "amount over 200.00 (in the call's currency)"
    # An `or` or a `not` does not fix it for its neighbours.
    assert words('amount_cents > 100 or currency == "USD"').startswith(
        "amount over 1.00 (in the call's currency)"
    )
    assert words('not (currency == "USD") and amount_cents > 100').endswith(
        "amount over 1.00 (in the call's currency)"
    )


def test_a_schema_that_allows_one_currency_fixes_it(monkeypatch) -> None:
    refund = capabilities.get(REFUND)
    properties = dict(refund.input_schema["properties"])
    properties["currency"] = {**properties["currency"], "enum": ["JPY"]}
    monkeypatch.setitem(refund.input_schema, "properties", properties)
    assert words("amount_cents > 5000") == "amount over ¥5,000"


def test_the_policy_pages_print_the_rules_currency(approver: User, tenant: Tenant) -> None:
    Policy.objects.create(
        tenant=tenant,
        capability_id=REFUND,
        version=1,
        rules=[
            {"name": "euro", "when": 'amount_cents > 30000 and currency == "EUR"', "approvers": 1},
            {"name": "any", "when": "amount_cents > 90000", "approvers": 2},
        ],
    )
    client: Client = logged_in(approver)
    for path in ("/policies/", f"/policies/{REFUND}/"):
        page = client.get(path).content.decode()
        assert "Refunds with amount over €300.00 and currency is “EUR” need 1 approver" in page
        assert "Refunds with amount over 900.00 (in the call&#x27;s currency) need 2" in page
        assert "$300.00" not in page and "$900.00" not in page
