"""Editing a policy: every change publishes the next immutable version, with a
`policy.published` admin event in the same transaction (runs/admin_events.py). Approvals opened
earlier keep the version they were evaluated under (they point at its row)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import transaction

from approvals import errors
from approvals.conditions import ConditionError, parse
from approvals.models import Policy
from approvals.policies import current_policy, validate_rules
from runs import events
from runs.admin_events import admin_event_append
from runs.errors import DomainError
from runs.models import Tenant, User

# An approval waits at least a minute and at most 30 days.
MIN_EXPIRY_SECONDS = 60
MAX_EXPIRY_SECONDS = 30 * 24 * 3600

events.register(
    "policy.published",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["capability", "version", "from_version", "rules"],
        "properties": {
            "capability": {"type": "string"},
            "version": {"type": "integer"},
            "from_version": {"type": "integer"},
            "rules": {"type": "array", "items": {"type": "object"}},
            "expiry_seconds": {"type": "integer"},
            "on_expiry": {"type": "string"},
            "escalation_group": {"type": "string"},
            "escalate_before_seconds": {"type": "integer"},
        },
    },
)


@dataclass(frozen=True)
class PolicyDraft:
    """What an admin wants the policy to say; not yet a version."""

    rules: list[dict[str, Any]] = field(default_factory=list)
    expiry_seconds: int = 24 * 3600
    on_expiry: str = Policy.OnExpiry.CANCEL
    escalation_group: str = ""
    escalate_before_seconds: int = 3600

    @classmethod
    def of(cls, policy: Policy) -> PolicyDraft:
        return cls(
            rules=list(policy.rules),
            expiry_seconds=policy.expiry_seconds,
            on_expiry=policy.on_expiry,
            escalation_group=policy.escalation_group,
            escalate_before_seconds=policy.escalate_before_seconds,
        )


def policy_check(draft: PolicyDraft) -> None:
    """422 with every problem, named: `policy.condition_not_allowed` when a condition is not
    in the language (its message says what is allowed), `policy.invalid` for the rest."""
    for number, rule in enumerate(draft.rules, start=1):
        try:
            parse(str(rule.get("when", "")) if isinstance(rule, dict) else "")
        except ConditionError as exc:
            raise DomainError(
                errors.POLICY_CONDITION_NOT_ALLOWED,
                f"Rule {number}: {exc}.",
                status=422,
                details=[{"field": f"rules.{number - 1}.when", "problem": str(exc)}],
            ) from exc
    problems = [{"field": "rules", "problem": problem} for problem in validate_rules(draft.rules)]
    if not MIN_EXPIRY_SECONDS <= draft.expiry_seconds <= MAX_EXPIRY_SECONDS:
        problems.append({"field": "expiry", "problem": "between 1 minute and 30 days"})
    if draft.on_expiry not in Policy.OnExpiry.values:
        problems.append({"field": "on_expiry", "problem": "cancel or hand_to_human"})
    if not 0 <= draft.escalate_before_seconds <= draft.expiry_seconds:
        problems.append({"field": "escalate_before", "problem": "at most the expiry"})
    if problems:
        text = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
        raise DomainError(errors.POLICY_INVALID, text, status=422, details=problems)


def policy_draft(*, tenant: Tenant, capability_id: str, draft: PolicyDraft) -> Policy:
    """The draft as an unsaved next version, for "try this rule": evaluated by the same code
    as a proposal (toolcalls.propose.tool_call_evaluate_policy), written nowhere."""
    policy_check(draft)
    latest = Policy.objects.filter(tenant=tenant, capability_id=capability_id).first()
    version = (latest.version + 1) if latest else 1
    return Policy(tenant=tenant, capability_id=capability_id, version=version, **asdict(draft))


def policy_publish(
    *, tenant: Tenant, capability_id: str, draft: PolicyDraft, based_on: int, by: User
) -> tuple[Policy, bool]:
    """Publish `draft` as the next version if it differs from the current one. `based_on` is
    the version the form showed: another admin's version since then is 409 `policy.stale`,
    never overwritten. Returns (policy, published)."""
    if not (by.is_tenant_admin and by.tenant_id == tenant.pk):
        raise DomainError(
            errors.POLICY_FORBIDDEN, "Only the tenant's admins edit policies.", status=403
        )
    policy_check(draft)
    current_policy(tenant, capability_id)  # version 1 (the defaults) is there to build on
    with transaction.atomic():
        latest = (
            Policy.objects.select_for_update()
            .filter(tenant=tenant, capability_id=capability_id)
            .order_by("-version")
            .first()
        )
        if latest.version != based_on:
            raise DomainError(
                errors.POLICY_STALE,
                f"Version {latest.version} was published ({latest.created_by or 'system'}) "
                f"after the version {based_on} you edited; nothing was saved. Open the policy "
                "again to see it, then make your change.",
            )
        if PolicyDraft.of(latest) == draft:
            return latest, False
        policy = Policy.objects.create(
            tenant=tenant,
            capability_id=capability_id,
            version=latest.version + 1,
            created_by=f"user:{by.username}",
            **asdict(draft),
        )
        admin_event_append(
            tenant=tenant,
            event_type="policy.published",
            subject=f"policy:{capability_id}",
            payload={
                "capability": capability_id,
                "version": policy.version,
                "from_version": latest.version,
                **asdict(draft),
            },
            by=by,
        )
    return policy, True
