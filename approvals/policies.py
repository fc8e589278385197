"""Which policy applies to a call, and what it asks for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from approvals import sql
from approvals.conditions import ConditionError, evaluate, parse
from approvals.models import Policy
from runs.models import Tenant

# Version 1 of each tenant's policies, written the first time a capability is used. Admins
# change them in the admin, which writes version 2, 3, ...
DEFAULTS: dict[str, dict[str, Any]] = {
    "refund-order-v2": {
        "rules": [
            {
                "name": "refunds over $200",
                "when": "amount_cents > 20000",
                "approvers": 1,
                "risk": "high",
            },
            {
                "name": "refunds over $1,000",
                "when": "amount_cents > 100000",
                "approvers": 2,
                "risk": "high",
            },
        ],
    },
    "reserve-stock-v1": {
        "rules": [
            {
                "name": "reservations over 20 units",
                "when": "quantity > 20",
                "approvers": 1,
                "risk": "medium",
            },
        ],
    },
}


@dataclass(frozen=True)
class Requirement:
    policy: Policy
    rule_name: str
    approvers: int
    risk: str


def validate_rules(rules: Any) -> list[str]:
    """Problems with a rules list, for the admin form; empty when it is fine."""
    if not isinstance(rules, list):
        return ["rules must be a list"]
    problems = []
    for number, rule in enumerate(rules, start=1):
        if not isinstance(rule, dict) or set(rule) - {"name", "when", "approvers", "risk"}:
            problems.append(f"rule {number}: an object with name, when, approvers, risk")
            continue
        try:
            parse(str(rule.get("when", "")))
        except ConditionError as exc:
            problems.append(f"rule {number}: {exc}")
        approvers = rule.get("approvers")
        if not isinstance(approvers, int) or not 0 <= approvers <= 5:
            problems.append(f"rule {number}: approvers is a whole number from 0 to 5")
    return problems


# The newest policy per (tenant id, capability), checked against the newest row's id before
# use (one short statement; the dispatcher reads it together with its other checks). Rows are
# never edited, only followed by a new version, so an entry is right while it is the newest.
_CACHE: dict[tuple[int, str], Policy] = {}


def current_policy(tenant: Tenant, capability_id: str, *, newest_id: int | None = None) -> Policy:
    """The newest version. `newest_id`: the newest row's id, when the caller read it already."""
    if newest_id is None:
        newest_id = sql.newest_policy_id(tenant.id, capability_id)
    cached = _CACHE.get((tenant.id, capability_id))
    if newest_id is not None and cached is not None and cached.id == newest_id:
        return cached
    policy = (
        Policy.objects.filter(tenant=tenant, capability_id=capability_id)
        .order_by("-version")
        .first()
    )
    if policy is not None:
        _CACHE[(tenant.pk, capability_id)] = policy
        return policy
    defaults = DEFAULTS.get(capability_id, {})
    try:
        with transaction.atomic():
            return Policy.objects.create(
                tenant=tenant,
                capability_id=capability_id,
                version=1,
                rules=defaults.get("rules", []),
                created_by="system:defaults",
            )
    except IntegrityError:
        # Another request wrote version 1 at the same moment.
        return Policy.objects.get(tenant=tenant, capability_id=capability_id, version=1)


def policy_preview(tenant: Tenant, capability_id: str) -> Policy:
    """The policy a proposal would meet now, writing nothing: the current version, or the
    default version 1 that the first proposal would write (unsaved)."""
    policy = (
        Policy.objects.filter(tenant=tenant, capability_id=capability_id)
        .order_by("-version")
        .first()
    )
    return policy if policy is not None else policy_default(tenant, capability_id)


def policy_default(tenant: Tenant, capability_id: str) -> Policy:
    """Version 1 as the first proposal would write it, unsaved."""
    rules = DEFAULTS.get(capability_id, {}).get("rules", [])
    return Policy(tenant=tenant, capability_id=capability_id, version=1, rules=rules)


def requirement(policy: Policy, args: dict[str, Any], default_risk: str) -> Requirement:
    """The matching rule that asks for the most approvers (ties: the first listed)."""
    best = Requirement(policy, "no rule matched", 0, default_risk)
    for rule in policy.rules:
        if evaluate(rule["when"], args) and rule["approvers"] > best.approvers:
            best = Requirement(
                policy,
                rule.get("name") or rule["when"],
                rule["approvers"],
                rule.get("risk", default_risk),
            )
    return best
