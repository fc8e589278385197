"""Checks of a call's arguments against its contract and against trusted data, shared by
proposals, approvers' decisions and edits, and compensations."""

from __future__ import annotations

import re
from typing import Any

from approvals.errors import EDIT_NOT_ALLOWED
from runs.errors import DomainError
from runs.models import Tenant
from toolcalls import errors, selectors
from toolcalls.capabilities import Capability, TrustedData, UpstreamUnavailable
from toolcalls.capabilities.base import OpenCall

# An integer typed into a form: ASCII digits with an optional leading minus, at most 15 of
# them (below 2^53, what canonical JSON carries). Not "١٢٣", "12_300", " 7", "+7" or "1e3",
# which Python's int() would take.
INTEGER_TEXT = re.compile(r"-?[0-9]{1,15}")
LARGEST_INTEGER = 2**53 - 1


def invalid(problems: list[dict[str, str]]) -> DomainError:
    fields = ", ".join(p["field"] for p in problems)
    return DomainError(
        errors.VALIDATION_FAILED, f"Fix these fields: {fields}.", status=422, details=problems
    )


def _open_calls(
    tenant: Tenant, exclude: str | None, capability_id: str, object_ref: str
) -> list[OpenCall]:
    return [
        OpenCall(
            id=call.pk,
            args=call.args,
            execution_status=call.execution_status,
            external_request_id=call.external_request_id,
            external_id=call.external_id,
        )
        for call in selectors.calls_effect_pending(
            tenant=tenant, capability_id=capability_id, object_ref=object_ref, exclude=exclude
        )
    ]


# Open calls a proposal read already, with its lookup: (capability id, object ref, calls).
KnownOpenCalls = tuple[str, str, list[OpenCall]]


def business_check(
    tenant: Tenant,
    capability: Capability,
    args: dict[str, Any],
    *,
    exclude: str | None = None,
    known_open_calls: KnownOpenCalls | None = None,
) -> list[dict]:
    """The contract's server-side check, against what the external system says and what our
    own not-yet-final calls on the object will still do (`exclude`: the call being checked).

    `known_open_calls`: those calls as the caller read them just before, answered without
    another query when the contract asks for them. Read before the external system is, a
    call that becomes final meanwhile is still counted, unless the system shows it already;
    read after, it would count nowhere."""

    def open_calls(capability_id: str, object_ref: str) -> list[OpenCall]:
        if known_open_calls is not None and known_open_calls[:2] == (capability_id, object_ref):
            return known_open_calls[2]
        return _open_calls(tenant, exclude, capability_id, object_ref)

    data = TrustedData(tenant.slug, open_calls=open_calls)
    try:
        return capability.business_check(data, args)
    except UpstreamUnavailable as exc:
        raise DomainError(
            errors.CHECK_UNAVAILABLE,
            f"Could not check the request against {capability.system}: {exc}. Try again.",
            status=503,
        ) from exc


def arguments_check(
    tenant: Tenant, capability: Capability, args: Any, *, exclude: str | None = None
) -> None:
    """Schema first (cheap, local), then the business check; raises the problems found."""
    problems = capability.validate(args) or business_check(
        tenant, capability, args, exclude=exclude
    )
    if problems:
        raise invalid(problems)


# --- approvers' edits -----------------------------------------------------------------------


def edit_value(spec: dict[str, Any], text: str) -> Any:
    """A value typed into the approval page's form, as its schema's type, strictly. Raises
    ValueError for text that is not exactly such a value."""
    if spec.get("type") == "integer":
        if not INTEGER_TEXT.fullmatch(text):
            raise ValueError("a whole number in digits 0-9, with an optional leading minus")
        return int(text)
    return text


def _typed_problem(spec: dict[str, Any] | None, value: Any) -> str | None:
    if spec is None:
        return "not an argument of this capability"
    kind = spec.get("type")
    if kind == "integer" and (type(value) is not int or abs(value) > LARGEST_INTEGER):
        return "must be a whole number"
    if kind == "string" and (not isinstance(value, str) or "\x00" in value):
        return "must be text without NUL characters"
    return None


def edits_check(capability: Capability, current: dict[str, Any], edits: dict[str, Any]) -> None:
    """An approver's edits, before anything is written: no field that identifies the object
    (the call keeps its object, revision and idempotency key), and each value exactly of its
    schema's type (the schema and business checks then judge the edited arguments)."""
    moved = [
        name
        for name, value in edits.items()
        if name in capability.identity_fields and current.get(name) != value
    ]
    if moved:
        raise DomainError(
            EDIT_NOT_ALLOWED,
            f"{', '.join(moved)} says which object this call acts on "
            f"({capability.object_ref(current)}) and cannot be edited; reject the call and let "
            "the agent propose one for the other object.",
            status=422,
            details=[
                {"field": f"args.{name}", "problem": "identifies the object: not editable"}
                for name in moved
            ],
        )
    properties = capability.input_schema["properties"]
    problems = [
        {"field": f"args.{name}", "problem": problem}
        for name, value in edits.items()
        if (problem := _typed_problem(properties.get(name), value))
    ]
    if problems:
        raise invalid(problems)
