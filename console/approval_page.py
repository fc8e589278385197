"""What the approval page shows beside the decision buttons, built from stored state: the
arguments labelled and formatted, why a person is asked, who decided and what they changed,
the agent's decision as JSON, other calls on the same object, and the typed edit form."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from approvals.models import Approval, ApprovalDecision
from console import formatting
from console.formatting import escaped as _h
from console.templatetags.console_format import relative_time
from runs.models import Tenant
from toolcalls import capabilities, context
from toolcalls.capabilities import Capability
from toolcalls.models import E, ToolCall

SIMPLE_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|>|<|==)\s*(-?\d+)\s*$")
COMPARISONS = {">": "over", ">=": "at least", "<": "under", "<=": "at most", "==": "exactly"}


def threshold_text(capability: Capability | None, condition: str, args: dict[str, Any]) -> str:
    """`amount_cents > 20000` as "Amount over $200.00"; other conditions as written."""
    match = SIMPLE_CONDITION.match(condition or "")
    if not match:
        return condition
    name, operator, number = match.groups()
    value = formatting.value_text(capability, name, int(number), args)
    return f"{formatting.label(capability, name)} {COMPARISONS[operator]} {value}"


def why_asked(approval: Approval, capability: Capability | None) -> dict[str, Any]:
    """The rule that asked for people, as the policy version it was asked under states it."""
    rule = next(
        (
            rule
            for rule in approval.policy.rules
            if (rule.get("name") or rule.get("when")) == approval.rule_name
        ),
        None,
    )
    condition = rule.get("when", "") if rule else ""
    return {
        "rule": approval.rule_name,
        "condition": condition,
        "threshold": threshold_text(capability, condition, approval.args) if condition else "",
        "policy_version": approval.policy_version,
        "approvers": approval.required_approvers,
        "risk": approval.risk,
    }


def edits_made(
    decisions: list[ApprovalDecision], capability: Capability | None, args: dict[str, Any]
) -> list[dict[str, Any]]:
    """Who decided so far, and what each edit changed on the way to these arguments."""
    made = []
    for decision in decisions:
        if not decision.edit_diff:
            made.append({"decision": decision, "changes": []})
            continue
        before = {**args, **{k: c.get("from") for k, c in decision.edit_diff.items()}}
        after = {**args, **{k: c.get("to") for k, c in decision.edit_diff.items()}}
        made.append(
            {
                "decision": decision,
                "changes": formatting.diff_rows(capability, decision.edit_diff, before, after),
            }
        )
    return made


def decision_json(call: ToolCall) -> str:
    """The agent's decision, indented as JSON (not Python's repr)."""
    if call.decision is None:
        return ""
    return json.dumps(call.decision.content, indent=2, ensure_ascii=False, sort_keys=True)


def call_summary(call: ToolCall) -> str:
    """A call in the words of its contract ("Refund 250.00 USD on order order-003.")."""
    capability = capabilities.get(call.capability_id)
    if capability is None:
        return call.capability_id
    try:
        return formatting.summary_text(capability, call.args, capability.summary(call.args))
    except (KeyError, TypeError, ValueError):
        return call.capability_id


def same_object_calls(
    tenant: Tenant, call: ToolCall, capability: Capability | None, now: datetime
) -> dict[str, Any]:
    """Other calls of this capability on this object, open or changed in the last day; a
    warning when one is still open or went out recently (the same refund asked twice)."""
    calls = context.calls_on_object(tenant=tenant, call=call, same_capability=True, now=now)
    amount_field = next(iter(formatting.money_fields(capability)), None)
    rows = []
    for other in calls:
        # Written here once, not looped over in the template for each row (issue #11).
        args = formatting.argument_rows(capability, other.args)
        rows.append(
            {
                "call": other,
                "args_text": "; ".join(
                    f"{arg['label']} {arg['text']}" for arg in args if arg["name"] != "order_id"
                ),
                "amount_text": next(
                    (arg["text"] for arg in args if arg["name"] == amount_field), ""
                ),
                "identical": other.args_digest == call.args_digest,
                "open": other.execution_status not in ToolCall.FINAL_EXECUTION,
                "done": other.execution_status == E.COMPLETED,
            }
        )
    warn = [row for row in rows if row["open"] or row["done"]]
    if capability is not None and capability.action == "refund":
        title = "Other refunds of this order"
    else:
        title = f"Other calls of {call.capability_id} on {call.object_ref}"
    return {
        "title": title,
        "rows": rows,
        "rows_html": other_calls_html(rows, now),
        "warn": warn,
        "warn_html": warning_items_html(warn, now),
        "identical": [row for row in warn if row["identical"]],
    }


def edit_fields(
    approval: Approval,
    capability: Capability | None,
    typed: dict[str, str] | None = None,
    problems: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The approve-with-edits form, typed from the schema: money in major units (dollars),
    whole numbers as numbers, enums as a select, text otherwise; the fields that identify
    the object shown read-only. `typed`/`problems`: what the person sent and what was wrong
    with it, after a refused preview."""
    if capability is None:
        return []
    typed, problems = typed or {}, problems or {}
    money = formatting.money_fields(capability)
    required = set(capability.input_schema.get("required", []))
    fields = []
    for name, spec in capability.input_schema["properties"].items():
        value = approval.args.get(name)
        if name in money:
            kind, shown = (
                "money",
                formatting.cents_to_major_units(value, approval.args.get("currency")),
            )
        elif spec.get("enum"):
            kind, shown = "select", "" if value is None else str(value)
        elif spec.get("type") == "integer":
            kind, shown = "number", "" if value is None else str(value)
        elif spec.get("maxLength", 0) > 500:
            kind, shown = "textarea", "" if value is None else str(value)
        else:
            kind, shown = "text", "" if value is None else str(value)
        fields.append(
            {
                "name": name,
                "label": formatting.label(capability, name),
                "kind": kind,
                "value": typed.get(name, shown),
                "choices": [str(choice) for choice in spec.get("enum", [])],
                "currency": (approval.args.get("currency") or "").upper(),
                "required": name in required,
                "editable": name not in capability.identity_fields,
                "min": spec.get("minimum"),
                "max": spec.get("maximum"),
                "problem": problems.get(name, ""),
            }
        )
    return fields


# --- the other calls' two lists, written in Python (same_object_calls' rows) ----------------
# The template's loops (a `{% url %}`, two get_..._display, the relative_time tag and a dozen
# look-ups per call, up to 20 calls twice) were the largest part of the page's template time.


def other_calls_html(rows: list[dict[str, Any]], now: datetime) -> SafeString:
    """The rows of the "Other calls" table, as templates/approvals/detail.html's loop wrote."""
    executions, verifications = _labels("execution_status"), _labels("verification_status")
    cells = []
    for row in rows:
        call = row["call"]
        status = call.execution_status
        identical = " <strong>identical</strong>" if row["identical"] else ""
        verified = ""
        if status == E.COMPLETED:
            verification = call.verification_status
            verified = f", verification {_h(verifications.get(verification, verification))}"
        cells.append(
            f'<tr><td data-label="Call"><code>{_h(call.id)}</code>{identical}</td>'
            f'<td data-label="Arguments">{_h(row["args_text"])}</td>'
            f'<td data-label="State"><span class="state state-{_h(status)}">'
            f"{_h(executions.get(status, status))}</span>{verified}</td>"
            f'<td data-label="Asked">{relative_time(call.created_at, now)}</td></tr>'
        )
    return mark_safe("".join(cells))  # every value above went through _h or format_html


def warning_items_html(rows: list[dict[str, Any]], now: datetime) -> SafeString:
    """The items of the duplicate warning, as templates/approvals/detail.html's loop wrote."""
    executions, run_url = _labels("execution_status"), _h(formatting.url_pattern("runs:detail"))
    items = []
    for row in rows:
        call = row["call"]
        status = call.execution_status
        amount = f"{_h(row['amount_text'])} " if row["amount_text"] else ""
        identical = " — <strong>identical arguments</strong>" if row["identical"] else ""
        items.append(
            f"\n      <li><code>{_h(call.id)}</code>: {amount}"
            f'<span class="state state-{_h(status)}">{_h(executions.get(status, status))}'
            f"</span>{identical}, asked {relative_time(call.created_at, now)} · "
            f'<a href="{run_url.format(_h(call.run_id))}">its run</a></li>'
        )
    return mark_safe("".join(items))  # every value above went through _h or format_html


def _labels(field: str) -> dict[str, str]:
    """A status field's labels by value, as its get_..._display shows them."""
    return {value: str(label) for value, label in ToolCall._meta.get_field(field).flatchoices}
