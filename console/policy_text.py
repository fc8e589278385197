"""Policies in words: each rule as a sentence ("Refunds with amount over €200.00 and
currency is “EUR” need 2 approvers, from people with the approver or admin role; expire after
4 h 30 min and then are cancelled"), amounts in the currency the rule fixes ("200.00 (in the
call's currency)" when it fixes none), durations in hours and minutes, and the difference
between two versions, line by line. Conditions are read from the same parsed tree the
evaluator walks (approvals/conditions.py); one the words below do not cover is quoted as
written."""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Any

from approvals.conditions import ConditionError, parse
from approvals.models import Policy
from console import formatting
from toolcalls import capabilities

# What a capability's calls are called in a sentence; others are "Calls to <title>".
NOUNS = {
    "refund-order-v2": "Refunds",
    "reserve-stock-v1": "Stock reservations",
}
OPERATORS = {
    ast.Gt: "over",
    ast.GtE: "at least",
    ast.Lt: "under",
    ast.LtE: "at most",
    ast.Eq: "is",
    ast.NotEq: "is not",
    ast.In: "is one of",
    ast.NotIn: "is not one of",
}
ON_EXPIRY = {
    Policy.OnExpiry.CANCEL: "then are cancelled",
    Policy.OnExpiry.HAND_TO_HUMAN: "then their run is handed to a person",
}


def duration(seconds: int) -> str:
    """4 h 30 min, 24 h, 45 min; under a minute in seconds."""
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    parts = ([f"{hours} h"] if hours else []) + ([f"{minutes} min"] if minutes else [])
    return " ".join(parts)


def is_money(field_name: str) -> bool:
    return field_name.endswith("_cents")


def money(cents: Any, currency: str | None) -> str:
    """An amount of a rule in its currency ("$200.00"); a rule that does not fix the currency
    compares the number whatever the call's currency is, and says so."""
    if isinstance(cents, bool) or not isinstance(cents, int | float):
        return repr(cents)
    if currency and isinstance(cents, int):
        return formatting.money(cents, currency)
    if isinstance(cents, int):
        number = formatting.money(cents, None)  # no currency: the bare number, "200.00"
    else:
        number = f"-{abs(cents) / 100:,.2f}" if cents < 0 else f"{cents / 100:,.2f}"
    return f"{number} (in the call's currency)"


def currency_field(capability_id: str, field_name: str) -> str:
    """The argument naming the currency of a money field: the capability's schema pairs
    `*_cents` with `currency` (console/formatting.py); else the argument `currency`."""
    return formatting.money_fields(capabilities.get(capability_id)).get(field_name, "currency")


def schema_currency(capability_id: str, field_name: str) -> str | None:
    """The one currency the capability's schema allows for the field (`const`, or an `enum`
    of one), if it fixes one."""
    capability = capabilities.get(capability_id)
    properties = capability.input_schema.get("properties", {}) if capability else {}
    spec = properties.get(currency_field(capability_id, field_name), {})
    allowed = [spec["const"]] if "const" in spec else spec.get("enum", [])
    return allowed[0] if len(allowed) == 1 and isinstance(allowed[0], str) else None


def _fixed_currencies(values: list[ast.AST]) -> dict[str, str]:
    """`currency == "EUR"` (or `in ["EUR"]`) among the operands of an `and`: each fixes the
    currency of every other operand. By field name."""
    fixed = {}
    for node in values:
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
            continue
        name, value = _field_name(node.left), _literal(node.comparators[0])
        if isinstance(node.ops[0], ast.In) and isinstance(value, list) and len(value) == 1:
            value = value[0]
        elif not isinstance(node.ops[0], ast.Eq):
            continue
        if name is not None and isinstance(value, str):
            fixed[name] = value
    return fixed


def noun(capability_id: str) -> str:
    if capability_id in NOUNS:
        return NOUNS[capability_id]
    capability = capabilities.get(capability_id)
    title = capability.title if capability else capability_id
    return f"Calls to {title[0].lower()}{title[1:]}"


def field_label(capability_id: str, field_name: str) -> str:
    """The schema's title for the field when it has one, else its name in words."""
    capability = capabilities.get(capability_id)
    properties = capability.input_schema.get("properties", {}) if capability else {}
    title = properties.get(field_name, {}).get("title")
    if title:
        return str(title).lower()
    return field_name.removesuffix("_cents").replace("_", " ").replace(".", " ")


def _field_name(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _value_words(field_name: str, value: Any, currency: str | None = None) -> str:
    if isinstance(value, list):
        return ", ".join(_value_words(field_name, item, currency) for item in value)
    if is_money(field_name):
        return money(value, currency)
    if isinstance(value, str):
        return f"“{value}”"
    return (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _words(node: ast.AST, capability_id: str, fixed: dict[str, str] | None = None) -> str:
    """`fixed`: the currency fields an enclosing `and` pins to one value; they hold inside
    every operand below it (an `or` or `not` below adds none of its own)."""
    fixed = fixed or {}
    if isinstance(node, ast.BoolOp):
        joiner = " and " if isinstance(node.op, ast.And) else " or "
        if isinstance(node.op, ast.And):
            fixed = {**fixed, **_fixed_currencies(node.values)}
        # A nested and/or is bracketed: "a and (b or c)" must not read as "(a and b) or c".
        return joiner.join(
            f"({_words(value, capability_id, fixed)})"
            if isinstance(value, ast.BoolOp)
            else _words(value, capability_id, fixed)
            for value in node.values
        )
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return f"not ({_words(node.operand, capability_id, fixed)})"
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        name = _field_name(node.left)
        value_node = node.comparators[0]
        if name is not None and _field_name(value_node) is None:
            words = OPERATORS[type(node.ops[0])]
            currency = None
            if is_money(name):
                currency = fixed.get(currency_field(capability_id, name)) or schema_currency(
                    capability_id, name
                )
            value = _value_words(name, _literal(value_node), currency)
            return f"{field_label(capability_id, name)} {words} {value}"
    return f"`{ast.unparse(node)}`"


def condition_words(condition: str, capability_id: str) -> str:
    try:
        return _words(parse(condition).body, capability_id)
    except ConditionError:
        return f"`{condition}`"


def rule_sentence(policy: Policy, rule: dict[str, Any]) -> str:
    who = rule.get("approvers", 0)
    subject = (
        f"{noun(policy.capability_id)} with {condition_words(rule['when'], policy.capability_id)}"
    )
    if not who:
        return f"{subject} need no approval."
    people = "approver" if who == 1 else "approvers"
    then = ON_EXPIRY.get(policy.on_expiry, policy.on_expiry)
    distinct = "" if who == 1 else " different"
    return (
        f"{subject} need {who}{distinct} {people}, from people with the approver or admin role "
        f"(risk {rule.get('risk', 'as the capability says')}); expire after "
        f"{duration(policy.expiry_seconds)} and {then}."
    )


def escalation_sentence(policy: Policy) -> str:
    if not policy.escalation_group.strip():
        return "No escalation."
    return (
        f"{duration(policy.escalate_before_seconds)} before expiry, an approval still open is "
        f"escalated to {policy.escalation_group}."
    )


def policy_lines(policy: Policy) -> list[str]:
    """The whole policy as sentences, one per line: what a diff compares."""
    lines = [
        f"“{rule.get('name') or rule['when']}”: {rule_sentence(policy, rule)}"
        for rule in policy.rules
    ]
    if not policy.rules:
        lines.append(f"{noun(policy.capability_id)} need no approval: no rule.")
    lines.append(escalation_sentence(policy))
    return lines


@dataclass(frozen=True)
class DiffLine:
    change: str  # "added", "removed" or "same"
    text: str


def policy_diff(older: Policy, newer: Policy) -> list[DiffLine]:
    before, after = policy_lines(older), policy_lines(newer)
    found = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after).get_opcodes():
        if tag == "equal":
            found += [DiffLine("same", line) for line in before[i1:i2]]
            continue
        found += [DiffLine("removed", line) for line in before[i1:i2]]
        found += [DiffLine("added", line) for line in after[j1:j2]]
    return found
