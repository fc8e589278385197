"""Operational figures, computed from stored state on every request.

Nothing is counted in process memory: whichever web process answers, after any restart, the
figures are what the tables say. Each figure is one grouped query over all tenants in scope,
so a scrape of every tenant costs the same dozen queries as a scrape of one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import (
    CharField,
    Count,
    F,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals import latency
from approvals.models import ApprovalLatency
from console import sql
from runs.models import Event, Run, Tenant
from toolcalls.models import (
    DESK_STATUSES,
    CircuitBreaker,
    E,
    Execution,
    Receipt,
    ToolCall,
    Verification,
)

APPROVAL_LATENCY_BUCKETS = latency.BUCKETS
ATTEMPTS_BUCKETS = (1, 2, 3, 5, 10)
# A look-up settles most unknowns in seconds; hours mean a person should look.
UNKNOWN_DWELL_BUCKETS = (60, 300, 900, 3600, 4 * 3600, 24 * 3600)
BREAKER_STATE_VALUES = {
    CircuitBreaker.State.CLOSED: 0,
    CircuitBreaker.State.HALF_OPEN: 1,
    CircuitBreaker.State.OPEN: 2,
}
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def duration_text(seconds: float) -> str:
    """12 s, 5 min, 4 h, 2 d: what a person reads at a glance."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


@dataclass
class Histogram:
    """Cumulative counts per upper bound, as Prometheus histograms have them."""

    bounds: tuple[int, ...]
    in_seconds: bool = False
    cumulative: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.cumulative = self.cumulative or [0] * len(self.bounds)

    def label(self, bound: float) -> str:
        return duration_text(bound) if self.in_seconds else str(bound)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    @property
    def mean_text(self) -> str:
        if self.mean is None:
            return "none"
        return duration_text(self.mean) if self.in_seconds else f"{self.mean:.1f}"

    @property
    def rows(self) -> list[tuple[str, int]]:
        """(“at most <bound>”, how many) for the dashboard, then everything."""
        return [
            *((self.label(b), n) for b, n in zip(self.bounds, self.cumulative, strict=True)),
            ("in all", self.count),
        ]

    def within(self, fraction: float) -> str:
        """The smallest bound that holds `fraction` of the observations: an honest quantile
        from bucket counts ("9 in 10 within 5 min")."""
        for bound, n in zip(self.bounds, self.cumulative, strict=True):
            if n >= fraction * self.count:
                return self.label(bound)
        return f"more than {self.label(self.bounds[-1])}"

    @property
    def half_within(self) -> str:
        return self.within(0.5)

    @property
    def nine_in_ten_within(self) -> str:
        return self.within(0.9)


@dataclass
class TenantFigures:
    tenant: str
    calls_by_execution: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(Execution.values, 0)
    )
    calls_by_verification: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(Verification.values, 0)
    )
    # Now minus when the oldest call still in result_unknown entered it; 0 with none.
    oldest_unknown_seconds: float = 0.0
    expired_leases: int = 0
    runs_needs_human: int = 0
    duplicate_effects: int = 0
    remote_dedupe_replays: int = 0
    approval_latency: Histogram = field(
        default_factory=lambda: Histogram(APPROVAL_LATENCY_BUCKETS, in_seconds=True)
    )
    attempts_per_call: Histogram = field(default_factory=lambda: Histogram(ATTEMPTS_BUCKETS))
    # Calls still in result_unknown, by how long they have been there.
    unknown_dwell: Histogram = field(
        default_factory=lambda: Histogram(UNKNOWN_DWELL_BUCKETS, in_seconds=True)
    )
    breakers: dict[str, str] = field(default_factory=dict)  # capability -> state

    @property
    def result_unknown(self) -> int:
        return self.calls_by_execution[E.RESULT_UNKNOWN]

    @property
    def calls_needs_human(self) -> int:
        return self.calls_by_execution[E.NEEDS_HUMAN]

    @property
    def oldest_unknown_text(self) -> str:
        return duration_text(self.oldest_unknown_seconds) if self.result_unknown else "none"

    @property
    def calls(self) -> int:
        return sum(self.calls_by_execution.values())

    @property
    def open_breakers(self) -> int:
        return sum(state != CircuitBreaker.State.CLOSED for state in self.breakers.values())


@dataclass
class MetricRows:
    """What `collect` reads, as rows: console/sql.py reads the same on PostgreSQL in four
    statements, `metric_rows_orm` through the ORM elsewhere."""

    tenants: list[tuple[int, str]]  # (id, slug), by slug
    # (tenant, execution, verification, fencing token, calls)
    calls: list[tuple[int, str, str, int, int]]
    # (tenant, oldest status_since, calls, calls newer than now minus each dwell bound)
    unknown: list[tuple]
    # (figure, tenant, n) for the per-tenant counts of COUNTED_FIGURES
    counts: list[tuple[str, int, int]]
    breakers: list[tuple[int, str, str]]  # (tenant, capability, state), by capability
    latency: list[tuple[int, int, int, int]]  # (tenant, bucket, count, total µs)


# TenantFigures' fields that are one count per tenant.
COUNTED_FIGURES = (
    "expired_leases",
    "runs_needs_human",
    "duplicate_effects",
    "remote_dedupe_replays",
)


def collect(*, tenant: Tenant | None, now: datetime | None = None) -> dict[str, TenantFigures]:
    """Figures per tenant slug: one tenant's, or every tenant's with `tenant=None`."""
    now = now or timezone.now()
    dwell_since = [now - timedelta(seconds=bound) for bound in UNKNOWN_DWELL_BUCKETS]
    if connection.vendor == "postgresql":
        tenant_id = None if tenant is None else tenant.pk
        rows = MetricRows(**sql.metric_rows(tenant_id=tenant_id, now=now, dwell_since=dwell_since))
    else:
        rows = metric_rows_orm(tenant=tenant, now=now, dwell_since=dwell_since)
    slugs = dict(rows.tenants)
    figures = {slug: TenantFigures(slug) for _, slug in rows.tenants}
    _calls_by_status(rows.calls, slugs, figures)
    for tenant_id, oldest, n, *newer in rows.unknown:
        tenant_figures = figures[slugs[tenant_id]]
        tenant_figures.oldest_unknown_seconds = max(0.0, (now - oldest).total_seconds())
        tenant_figures.unknown_dwell.count = n
        tenant_figures.unknown_dwell.cumulative = list(newer)
    for figure, tenant_id, n in rows.counts:
        setattr(figures[slugs[tenant_id]], figure, n)
    for tenant_id, capability, state in rows.breakers:
        figures[slugs[tenant_id]].breakers[capability] = state
    for tenant_id, bucket, count, total_us in rows.latency:
        # From the latency counts (approvals/latency.py): a few rows per tenant, kept in the
        # transactions that decided, whatever the number of decisions.
        histogram = figures[slugs[tenant_id]].approval_latency
        histogram.count += count
        histogram.total += total_us / 1_000_000
        for i in range(bucket, len(histogram.bounds)):
            histogram.cumulative[i] += count
    return figures


def _calls_by_status(
    rows: list[tuple[int, str, str, int, int]],
    slugs: dict[int, str],
    figures: dict[str, TenantFigures],
) -> None:
    """Calls by execution and by verification status, and attempts per call sent at least
    once, from one scan of the index (tenant, execution, verification, fencing token): each
    claim is one attempt and one fencing token (toolcalls/dispatch.py, `_take`), so a call's
    token counts its attempts without reading the attempts."""
    for tenant_id, execution, verification, attempts, n in rows:
        tenant_figures = figures[slugs[tenant_id]]
        tenant_figures.calls_by_execution[execution] += n
        tenant_figures.calls_by_verification[verification] += n
        if attempts:
            histogram = tenant_figures.attempts_per_call
            histogram.count += n
            histogram.total += attempts * n
            for i, bound in enumerate(histogram.bounds):
                if attempts <= bound:
                    histogram.cumulative[i] += n


def _scoped(rows: QuerySet, tenant: Tenant | None, path: str = "tenant") -> QuerySet:
    return rows if tenant is None else rows.filter(**{path: tenant})


def metric_rows_orm(
    *, tenant: Tenant | None, now: datetime, dwell_since: list[datetime]
) -> MetricRows:
    """The rows of `collect` through the ORM (what console/sql.py reads on PostgreSQL)."""
    calls = _scoped(ToolCall.objects.order_by(), tenant)
    status_rows = calls.values_list(
        "tenant_id", "execution_status", "verification_status", "fencing_token"
    ).annotate(n=Count("*"))
    # How long each call still in result_unknown has been there, bucketed in SQL, from the
    # time it entered its status (`status_since`, stamped with its tool_call.result_unknown
    # event): read from the desk's partial index, without probing the log per call.
    newer = {
        f"le_{i}": Count("pk", filter=Q(status_since__gte=since))
        for i, since in enumerate(dwell_since)
    }
    unknown = (
        calls.filter(execution_status__in=DESK_STATUSES)
        .filter(execution_status=E.RESULT_UNKNOWN)
        .values_list("tenant_id")
        .annotate(oldest=Min("status_since"), n=Count("pk"), **newer)
    )
    expired = calls.filter(execution_status=E.DISPATCHING, lease_expires_at__lt=now)
    runs = _scoped(Run.objects.order_by(), tenant).filter(state=Run.State.NEEDS_HUMAN)
    replays = _scoped(Receipt.objects.order_by(), tenant, "tool_call__tenant").filter(
        status=Receipt.Status.ALREADY_EXISTS
    )
    counts = {
        "expired_leases": expired.values_list("tenant_id"),
        "runs_needs_human": runs.values_list("tenant_id"),
        "duplicate_effects": _duplicate_effects(_scoped(Event.objects.order_by(), tenant)),
        "remote_dedupe_replays": replays.values_list("tool_call__tenant_id"),
    }
    breakers = _scoped(CircuitBreaker.objects.order_by("capability_id"), tenant)
    latency = _scoped(ApprovalLatency.objects.order_by(), tenant)
    tenants = Tenant.objects.order_by("slug")
    if tenant is not None:
        tenants = tenants.filter(pk=tenant.pk)
    return MetricRows(
        tenants=list(tenants.values_list("pk", "slug")),
        calls=list(status_rows),
        unknown=list(unknown),
        counts=[
            (figure, tenant_id, n)
            for figure, rows in counts.items()
            for tenant_id, n in rows.annotate(n=Count("pk"))
        ],
        breakers=list(breakers.values_list("tenant_id", "capability_id", "state")),
        latency=list(latency.values_list("tenant_id", "bucket", "count", "total_us")),
    )


def _duplicate_effects(events: QuerySet[Event]) -> QuerySet:
    """A stale worker's answer named another external id than the one the call accepted: the
    external system did the thing twice. (The same id is a deduplicated resend: no harm.)"""
    accepted = ToolCall.objects.filter(pk=OuterRef("tool_call_id")).values("external_id")[:1]
    return (
        events.filter(event_type="tool_call.stale_result_refused")
        .annotate(
            seen=Coalesce(KT("payload__external_id"), Value(""), output_field=CharField()),
            accepted=Coalesce(Subquery(accepted), Value("")),
        )
        .exclude(Q(seen="") | Q(accepted="") | Q(seen=F("accepted")))
        .values_list("tenant_id")
    )


# --- Prometheus text format 0.0.4 ------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return "+Inf" if value == float("inf") else repr(float(value))


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        inner = ",".join(f'{key}="{_escape(str(v))}"' for key, v in labels.items())
        self.lines.append(f"{name}{{{inner}}} {_number(value)}")

    def histogram(self, name: str, histograms: dict[str, Histogram]) -> None:
        for slug, histogram in histograms.items():
            for bound, n in zip(histogram.bounds, histogram.cumulative, strict=True):
                self.sample(f"{name}_bucket", {"tenant": slug, "le": _number(float(bound))}, n)
            self.sample(f"{name}_bucket", {"tenant": slug, "le": "+Inf"}, histogram.count)
            self.sample(f"{name}_sum", {"tenant": slug}, float(histogram.total))
            self.sample(f"{name}_count", {"tenant": slug}, histogram.count)


# long: one block per metric family, in the order Prometheus shows them; splitting it would
# only scatter the list.
def render_prometheus(figures: dict[str, TenantFigures]) -> str:
    out = _Text()

    def per_tenant(
        name: str, kind: str, help_text: str, value_of: Callable[[TenantFigures], float]
    ) -> None:
        out.family(name, kind, help_text)
        for slug, tenant_figures in figures.items():
            out.sample(name, {"tenant": slug}, value_of(tenant_figures))

    out.family("countersign_tool_calls", "gauge", "Tool calls by execution status.")
    for slug, f in figures.items():
        for state, n in f.calls_by_execution.items():
            out.sample("countersign_tool_calls", {"tenant": slug, "state": state}, n)
    out.family("countersign_tool_call_verifications", "gauge", "Tool calls by verification status.")
    for slug, f in figures.items():
        for state, n in f.calls_by_verification.items():
            out.sample("countersign_tool_call_verifications", {"tenant": slug, "state": state}, n)
    per_tenant(
        "countersign_tool_calls_result_unknown",
        "gauge",
        "Tool calls whose outcome is unknown (a lost answer), waiting for a look-up.",
        lambda f: f.result_unknown,
    )
    per_tenant(
        "countersign_tool_calls_result_unknown_oldest_seconds",
        "gauge",
        "Seconds since the oldest call still in result_unknown entered it (0 with none).",
        lambda f: f.oldest_unknown_seconds,
    )
    per_tenant(
        "countersign_tool_calls_lease_expired",
        "gauge",
        "Dispatching tool calls whose lease expired: their worker died or hangs.",
        lambda f: f.expired_leases,
    )
    per_tenant(
        "countersign_tool_calls_needs_human",
        "gauge",
        "Tool calls handed to a person.",
        lambda f: f.calls_needs_human,
    )
    per_tenant(
        "countersign_runs_needs_human",
        "gauge",
        "Runs handed to a person.",
        lambda f: f.runs_needs_human,
    )
    out.family(
        "countersign_approval_latency_seconds",
        "histogram",
        "Seconds from an approval's creation to its approval or rejection.",
    )
    out.histogram(
        "countersign_approval_latency_seconds",
        {slug: f.approval_latency for slug, f in figures.items()},
    )
    out.family(
        "countersign_tool_call_attempts",
        "histogram",
        "Attempts per tool call, over calls sent at least once.",
    )
    out.histogram(
        "countersign_tool_call_attempts",
        {slug: f.attempts_per_call for slug, f in figures.items()},
    )
    per_tenant(
        "countersign_duplicate_effects_total",
        "counter",
        "Second external effects found by reconciliation: a stale worker's answer named "
        "another external id than the call's accepted one.",
        lambda f: f.duplicate_effects,
    )
    per_tenant(
        "countersign_remote_dedupe_replays_total",
        "counter",
        "Receipts the external system answered as already existing (its idempotency key "
        "deduplicated a resend).",
        lambda f: f.remote_dedupe_replays,
    )
    out.family(
        "countersign_circuit_breaker_state",
        "gauge",
        "Circuit breaker per capability: 0 closed, 1 half_open, 2 open.",
    )
    for slug, f in figures.items():
        for capability, state in f.breakers.items():
            out.sample(
                "countersign_circuit_breaker_state",
                {"tenant": slug, "capability": capability},
                BREAKER_STATE_VALUES[state],
            )
    return "\n".join(out.lines) + "\n"
