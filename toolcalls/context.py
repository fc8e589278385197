"""What an approver reads about a call's object beside its arguments: the capability's context
reader at the external system, with the tenant's credentials (toolcalls/capabilities), and
our own other calls on the object.

The read is short and never fails the page: a system that is slow or down gives a sentence
saying so ("couldn't reach the payment gateway (timed out after 2 s)") and when it was tried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

import httpx
from django.conf import settings
from django.utils import timezone

from runs.models import Tenant
from toolcalls import capabilities, keepalive, selectors
from toolcalls.capabilities import TrustedData, UpstreamUnavailable
from toolcalls.capabilities.base import Fact
from toolcalls.checks import _open_calls
from toolcalls.models import ToolCall

# Long enough for a healthy system, short enough that an approver is not left waiting.
DEFAULT_TIMEOUT = 2.0
# "Recently done": calls on the object that changed within this window are shown and warned of.
RECENT = timedelta(hours=24)

SYSTEM_NAMES = {
    "payments": "the payment gateway",
    "warehouse": "the warehouse",
    "carrier": "the carrier",
    "mailer": "the mailer",
}


@dataclass
class ObjectContext:
    object_ref: str
    system: str
    read_at: datetime
    facts: list[Fact] = field(default_factory=list)
    # Why the external system said nothing (None: it answered, or there is no reader).
    problem: str | None = None
    has_reader: bool = False


def system_name(system: str) -> str:
    return SYSTEM_NAMES.get(system, system)


def _why_unreachable(exc: UpstreamUnavailable, system: str, timeout: float) -> str:
    cause = exc.__cause__
    if isinstance(cause, keepalive.ReadFailed):
        cause = cause.__cause__  # the socket's own error
    if isinstance(cause, httpx.TimeoutException | TimeoutError):
        reason = f"timed out after {timeout:g} s"
    elif isinstance(cause, httpx.ConnectError | ConnectionRefusedError):
        reason = "the connection was refused"
    else:
        reason = str(exc).removeprefix(f"{system} ")
    return f"couldn't reach {system_name(system)} ({reason})"


def object_context(*, tenant: Tenant, call: ToolCall) -> ObjectContext:
    """The capability's reading of the call's object, now. Reads the external system (with a
    short timeout) and our not-yet-final calls on the object; never raises for an outage."""
    capability = capabilities.get(call.capability_id)
    context = ObjectContext(
        object_ref=call.object_ref,
        system=capability.system if capability else "",
        read_at=timezone.now(),
    )
    if capability is None or capability.context is None:
        return context
    context.has_reader = True
    timeout = getattr(settings, "OBJECT_CONTEXT_TIMEOUT", DEFAULT_TIMEOUT)
    data = TrustedData(
        tenant.slug, timeout=timeout, open_calls=partial(_open_calls, tenant, call.pk)
    )
    try:
        context.facts = capability.context(data, call.args)
    except UpstreamUnavailable as exc:
        context.problem = _why_unreachable(exc, capability.system, timeout)
    context.read_at = timezone.now()
    return context


def calls_on_object(
    *, tenant: Tenant, call: ToolCall, same_capability: bool, now: datetime
) -> list[ToolCall]:
    """The other calls on the call's object that are open or changed in the last day."""
    return selectors.calls_on_object(
        tenant=tenant,
        object_ref=call.object_ref,
        capability_id=call.capability_id if same_capability else None,
        exclude=call.pk,
        since=now - RECENT,
    )
