"""Checks of a call's arguments against its contract and against trusted data, shared by
proposals, approvers' edits and compensations."""

from __future__ import annotations

from typing import Any

from runs.errors import DomainError
from runs.models import Tenant
from toolcalls import errors
from toolcalls.capabilities import Capability, TrustedData, UpstreamUnavailable


def invalid(problems: list[dict[str, str]]) -> DomainError:
    fields = ", ".join(p["field"] for p in problems)
    return DomainError(
        errors.VALIDATION_FAILED, f"Fix these fields: {fields}.", status=422, details=problems
    )


def business_check(tenant: Tenant, capability: Capability, args: dict[str, Any]) -> list[dict]:
    """The contract's server-side check, against what the external system says."""
    try:
        return capability.business_check(TrustedData(tenant.slug), args)
    except UpstreamUnavailable as exc:
        raise DomainError(
            errors.CHECK_UNAVAILABLE,
            f"Could not check the request against {capability.system}: {exc}. Try again.",
            status=503,
        ) from exc


def arguments_check(tenant: Tenant, capability: Capability, args: Any) -> None:
    """Schema first (cheap, local), then the business check; raises the problems found."""
    problems = capability.validate(args) or business_check(tenant, capability, args)
    if problems:
        raise invalid(problems)
