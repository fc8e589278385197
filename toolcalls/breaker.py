"""Circuit breakers per tenant and capability (DESIGN section 7).

Closed: calls pass. When upstream errors reach ERROR_RATE of the recent attempts (at least
MIN_ATTEMPTS within WINDOW), the breaker opens for OPEN_FOR and calls wait. After that one
call passes as a probe (half-open): its success closes the breaker, its failure opens it again.
A probe that ends without an answer for the breaker (its worker died, its answer was lost, the
system refused it) hands the probe to the next call that asks.
All changes are conditional updates, so two workers never both take the probe.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from toolcalls.models import Attempt, CircuitBreaker, E, ToolCall

# Errors that say the system is unwell (not that our request was wrong).
UPSTREAM_ERRORS = ("tool.upstream_5xx", "tool.timeout", "tool.unreachable", "tool.connection_lost")
WINDOW = timedelta(seconds=60)
MIN_ATTEMPTS = 5
ERROR_RATE = 0.5
# While another call holds the probe, the others look again after this long.
PROBE_WAIT = timedelta(seconds=2)


def open_for() -> timedelta:
    return timedelta(seconds=settings.CIRCUIT_OPEN_SECONDS)


def admit(call: ToolCall, now: datetime) -> tuple[datetime | None, bool]:
    """(when to try again, or None to send now; whether the breaker was closed)."""
    breaker = CircuitBreaker.objects.filter(
        tenant_id=call.tenant_id, capability_id=call.capability_id
    ).first()
    if breaker is None or breaker.state == CircuitBreaker.State.CLOSED:
        return None, True
    if breaker.state == CircuitBreaker.State.OPEN:
        if breaker.opened_until and breaker.opened_until > now:
            return breaker.opened_until, False
        took_probe = CircuitBreaker.objects.filter(
            pk=breaker.pk, state=CircuitBreaker.State.OPEN, opened_until=breaker.opened_until
        ).update(state=CircuitBreaker.State.HALF_OPEN, probe_tool_call_id=call.pk)
        return (None if took_probe else now + PROBE_WAIT), False
    if breaker.probe_tool_call_id == call.pk or _take_over_probe(breaker, call):
        return None, False
    return now + PROBE_WAIT, False


def _take_over_probe(breaker: CircuitBreaker, call: ToolCall) -> bool:
    """Half-open, with the probe held by another call: take it over if that call will never
    report. Only the dispatcher's record of an answer closes or reopens the breaker; a probe
    whose worker died (its lease expired and the reconciler took it), whose answer was lost,
    or that ended any other way than by that record is neither dispatching nor waiting to be
    sent again. Left to it, the breaker stayed half-open for good and every call of its
    capability waited (manage.py soak: six refunds deferred every 2 s for 300 s).

    An authorized probe keeps the probe: it is sent again (a retry after a backoff, or after a
    look-up proved it absent) and its own claim passes. So does one claimed earlier in this
    transaction: a batch saves its claims when the batch ends, so the database still says
    authorized. A conditional update, as for the first probe: one taker at a time."""
    probe_status = (
        ToolCall.objects.filter(pk=breaker.probe_tool_call_id)
        .values_list("execution_status", flat=True)
        .first()
    )
    if probe_status in (E.AUTHORIZED, E.DISPATCHING):
        return False  # its answer is on its way to the breaker, or it will be sent again
    return bool(
        CircuitBreaker.objects.filter(
            pk=breaker.pk,
            state=CircuitBreaker.State.HALF_OPEN,
            probe_tool_call_id=breaker.probe_tool_call_id,
        ).update(probe_tool_call_id=call.pk)
    )


def record_success(call: ToolCall) -> None:
    CircuitBreaker.objects.filter(
        tenant_id=call.tenant_id, capability_id=call.capability_id
    ).exclude(state=CircuitBreaker.State.CLOSED).update(
        state=CircuitBreaker.State.CLOSED, opened_until=None, probe_tool_call_id=""
    )


def record_failure(call: ToolCall, error_name: str, now: datetime) -> bool:
    """Note an upstream failure; returns True when it opened the breaker."""
    if error_name not in UPSTREAM_ERRORS:
        return False
    breaker, _ = CircuitBreaker.objects.get_or_create(
        tenant_id=call.tenant_id, capability_id=call.capability_id
    )
    if breaker.state == CircuitBreaker.State.HALF_OPEN:
        if breaker.probe_tool_call_id != call.pk:
            return False
        return _open(breaker, CircuitBreaker.State.HALF_OPEN, now)
    if breaker.state == CircuitBreaker.State.OPEN:
        return False
    recent = Attempt.objects.filter(
        tool_call__tenant_id=call.tenant_id,
        tool_call__capability_id=call.capability_id,
        started_at__gte=now - WINDOW,
    ).exclude(classification=Attempt.Classification.IN_FLIGHT)
    total = recent.count()
    failures = recent.filter(error_name__in=UPSTREAM_ERRORS).count()
    if total >= MIN_ATTEMPTS and failures / total >= ERROR_RATE:
        return _open(breaker, CircuitBreaker.State.CLOSED, now)
    return False


def _open(breaker: CircuitBreaker, expected: str, now: datetime) -> bool:
    return bool(
        CircuitBreaker.objects.filter(pk=breaker.pk, state=expected).update(
            state=CircuitBreaker.State.OPEN, opened_until=now + open_for(), probe_tool_call_id=""
        )
    )
