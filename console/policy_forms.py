"""The policy editor's forms: one row per rule (field, operator, value — or a condition for
what a single comparison cannot say — approvers, risk), the expiry in hours and minutes, and
what the "try this rule" box reads (example arguments, or a recent call's)."""

from __future__ import annotations

import ast
import json
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms

from approvals.conditions import ConditionError, parse
from approvals.models import Policy
from approvals.policy_edits import PolicyDraft
from console.policy_text import field_label, is_money
from runs.models import Tenant
from toolcalls import capabilities
from toolcalls.models import ToolCall

OPERATORS = [
    (">", "is over"),
    (">=", "is at least"),
    ("<", "is under"),
    ("<=", "is at most"),
    ("==", "is"),
    ("!=", "is not"),
    ("in", "is one of"),
    ("not in", "is not one of"),
]
AST_OPERATORS = {
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
}
RISKS = [("low", "low"), ("medium", "medium"), ("high", "high")]
RECENT_CALLS = 10


def schema_fields(capability_id: str) -> dict[str, dict[str, Any]]:
    capability = capabilities.get(capability_id)
    return dict(capability.input_schema.get("properties", {})) if capability else {}


def field_choices(capability_id: str) -> list[tuple[str, str]]:
    choices = [("", "— a condition instead —")]
    for name, spec in schema_fields(capability_id).items():
        if spec.get("type") in ("integer", "number", "string", "boolean"):
            # The value is typed in units of the call's currency (200.00), not cents.
            unit = " (in currency units, not cents)" if is_money(name) else ""
            choices.append((name, f"{field_label(capability_id, name)}{unit}"))
    return choices


class RuleForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, label="Name")
    field = forms.ChoiceField(required=False, label="Field")
    # An initial value, so an untouched empty row is not "changed" (and not validated).
    operator = forms.ChoiceField(choices=OPERATORS, required=False, initial=">", label="Operator")
    value = forms.CharField(max_length=500, required=False, label="Value")
    condition = forms.CharField(max_length=500, required=False, label="Or a condition")
    approvers = forms.IntegerField(min_value=0, max_value=5, initial=1, label="Approvers")
    risk = forms.ChoiceField(choices=RISKS, initial="high", label="Risk")

    def __init__(self, *args: Any, capability_id: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capability_id = capability_id
        self.fields["field"].choices = field_choices(capability_id)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        condition = (data.get("condition") or "").strip()
        if condition:
            when, where = condition, "condition"
        elif data.get("field"):
            when, where = self._comparison(data), "value"
        else:
            self.add_error("field", "Choose a field, or write a condition.")
            return data
        if when is None:
            return data
        try:
            parse(when)
        except ConditionError as exc:
            self.add_error(where, f"{exc}.")
            return data
        data["when"] = when
        return data

    def _comparison(self, data: dict[str, Any]) -> str | None:
        name, operator = data["field"], data.get("operator") or ">"
        raw = (data.get("value") or "").strip()
        if operator in ("in", "not in"):
            items = [self._literal(name, part.strip()) for part in raw.split(",") if part.strip()]
            if any(item is None for item in items) or not items:
                return None
            return f"{name} {operator} [{', '.join(items)}]"
        literal = self._literal(name, raw)
        return None if literal is None else f"{name} {operator} {literal}"

    def _literal(self, name: str, raw: str) -> str | None:
        """The value as the condition language writes it, in the field's type; None (and an
        error beside the value) when it is not one."""
        kind = schema_fields(self.capability_id).get(name, {}).get("type")
        if kind == "string":
            return json.dumps(raw)
        if kind == "boolean" and raw.lower() in ("true", "false"):
            return raw.capitalize()
        try:
            number = Decimal(raw.replace("$", "").replace(",", ""))
        except InvalidOperation:
            number = None
        if number is None or not number.is_finite():
            self.add_error("value", f"“{raw}” is not a number.")
            return None
        if is_money(name):
            return str(int((number * 100).to_integral_value()))
        if kind == "integer" and number != number.to_integral_value():
            self.add_error("value", f"{name} is a whole number.")
            return None
        return str(number)


def rule_initial(capability_id: str, rule: dict[str, Any]) -> dict[str, Any]:
    """The form row of a stored rule: a single comparison of a known field fills field,
    operator and value; anything else stays a condition."""
    initial = {
        "name": rule.get("name", ""),
        "approvers": rule.get("approvers", 1),
        "risk": rule.get("risk", "high"),
        "condition": rule.get("when", ""),
    }
    try:
        node = parse(rule.get("when", "")).body
    except ConditionError:
        return initial
    fields = schema_fields(capability_id)
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return initial
    if not (isinstance(node.left, ast.Name) and node.left.id in fields):
        return initial
    try:
        value = ast.literal_eval(node.comparators[0])
    except ValueError:
        return initial
    values = value if isinstance(value, list) else [value]
    if is_money(node.left.id) and all(isinstance(v, int) for v in values):
        values = [f"{v / 100:.2f}" for v in values]
    return {
        **initial,
        "condition": "",
        "field": node.left.id,
        "operator": AST_OPERATORS[type(node.ops[0])],
        "value": ", ".join(str(v) for v in values),
    }


RuleFormSet = forms.formset_factory(RuleForm, extra=1, can_delete=True, max_num=20)


class PolicyForm(forms.Form):
    based_on = forms.IntegerField(widget=forms.HiddenInput)
    expiry_hours = forms.IntegerField(min_value=0, max_value=720, label="Hours")
    expiry_minutes = forms.IntegerField(min_value=0, max_value=59, label="Minutes")
    on_expiry = forms.ChoiceField(choices=Policy.OnExpiry.choices, label="Then")
    escalation_group = forms.CharField(max_length=500, required=False, label="Escalate to")
    escalate_hours = forms.IntegerField(min_value=0, max_value=720, label="Hours before")
    escalate_minutes = forms.IntegerField(min_value=0, max_value=59, label="Minutes before")

    @classmethod
    def initial_of(cls, policy: Policy) -> dict[str, Any]:
        return {
            "based_on": policy.version,
            "expiry_hours": policy.expiry_seconds // 3600,
            "expiry_minutes": policy.expiry_seconds % 3600 // 60,
            "on_expiry": policy.on_expiry,
            "escalation_group": policy.escalation_group,
            "escalate_hours": policy.escalate_before_seconds // 3600,
            "escalate_minutes": policy.escalate_before_seconds % 3600 // 60,
        }


def forms_for(policy: Policy, data: Any = None) -> tuple[PolicyForm, Any]:
    initial = [rule_initial(policy.capability_id, rule) for rule in policy.rules]
    kwargs = {"capability_id": policy.capability_id}
    if data is None:
        rules = RuleFormSet(initial=initial, prefix="rules", form_kwargs=kwargs)
        return PolicyForm(initial=PolicyForm.initial_of(policy)), rules
    rules = RuleFormSet(data, initial=initial, prefix="rules", form_kwargs=kwargs)
    return PolicyForm(data), rules


def forms_with_another_rule(policy: Policy, data: Any) -> tuple[PolicyForm, Any]:
    """The forms as typed, with one more empty rule row (up to the formset's maximum).
    Nothing is saved; a row typed half-way shows what it still needs."""
    total = data.get("rules-TOTAL_FORMS", "")
    if not total.isdigit():
        # Not this editor's form: start again from the version in force.
        return forms_for(policy)
    more = data.copy()
    count = min(int(total) + 1, RuleFormSet.max_num)
    more["rules-TOTAL_FORMS"] = str(count)
    # The new row's data is its fields' initial values, as an empty row the page rendered
    # itself would send: unchanged, it is skipped, not refused, when the form is sent.
    for name, field in RuleForm.base_fields.items():
        if field.initial is not None and f"rules-{count - 1}-{name}" not in more:
            more[f"rules-{count - 1}-{name}"] = str(field.initial)
    form, rules = forms_for(policy, more)
    # The page reloads: the cursor goes to the new row rather than the top of the page.
    rules.forms[-1].fields["name"].widget.attrs["autofocus"] = True
    return form, rules


def draft_of(form: PolicyForm, rules: Any) -> PolicyDraft:
    """The draft the valid forms describe (call after is_valid() on both)."""
    data = form.cleaned_data
    kept = [
        row.cleaned_data
        for row in rules.forms
        if row.cleaned_data and row.cleaned_data.get("when") and not row.cleaned_data["DELETE"]
    ]
    return PolicyDraft(
        rules=[
            {
                "name": row["name"].strip() or row["when"],
                "when": row["when"],
                "approvers": row["approvers"],
                "risk": row["risk"],
            }
            for row in kept
        ],
        expiry_seconds=data["expiry_hours"] * 3600 + data["expiry_minutes"] * 60,
        on_expiry=data["on_expiry"],
        escalation_group=data["escalation_group"].strip(),
        escalate_before_seconds=data["escalate_hours"] * 3600 + data["escalate_minutes"] * 60,
    )


def recent_calls(*, tenant: Tenant, capability_id: str) -> list[ToolCall]:
    """The tenant's latest calls of the capability, to try a rule against their arguments."""
    return list(
        ToolCall.objects.filter(tenant=tenant, capability_id=capability_id)
        .only("id", "args", "capability_id", "object_ref", "created_at")
        .order_by("-created_at")[:RECENT_CALLS]
    )


def example_args(capability_id: str) -> str:
    capability = capabilities.get(capability_id)
    examples = capability.input_schema.get("examples", []) if capability else []
    return json.dumps(examples[0] if examples else {}, indent=2)
