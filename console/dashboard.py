"""The dashboard's panels beyond /metrics: pending approvals by age, and the last 24 hours
hour by hour (calls proposed, dispatched, and answers lost), drawn as an inline SVG on the
server. Each is one grouped query over an index; nothing is kept in memory between requests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.db.models.functions import TruncHour

from approvals.models import Approval
from console.metrics import duration_text
from runs.models import Event, Tenant

# A person usually decides within minutes; a day old is close to expiring (24 h by default).
APPROVAL_AGE_BUCKETS = (300, 3600, 4 * 3600, 12 * 3600)
TREND_SERIES = (
    ("tool_call.proposed", "proposed"),
    ("tool_call.dispatching", "dispatched"),
    ("tool_call.result_unknown", "answer lost"),
)
TREND_HOURS = 24
# The chart's box, in SVG user units; it scales to the card's width.
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 480, 160, 36, 20, 8


@dataclass
class Bucket:
    label: str
    count: int


def approvals_by_age(*, tenant: Tenant, now: datetime) -> list[Bucket]:
    """Pending approvals by how long they have waited: under 5 min, 5 min to 1 h, …"""
    # Counts of created_at (never null) and COUNT(*), not of id: with created_at included in
    # approval_changed, that index alone answers it (10,000 pending approvals, no table reads).
    counts = {
        f"b{i}": Count("created_at", filter=Q(created_at__gt=now - timedelta(seconds=bound)))
        for i, bound in enumerate(APPROVAL_AGE_BUCKETS)
    }
    row = Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING).aggregate(
        n=Count("*"), **counts
    )
    buckets, below, lower = [], 0, "0 s"
    for i, bound in enumerate(APPROVAL_AGE_BUCKETS):
        upper = duration_text(bound)
        buckets.append(Bucket(f"{lower} to {upper}", row[f"b{i}"] - below))
        below, lower = row[f"b{i}"], upper
    buckets.append(Bucket(f"over {lower}", row["n"] - below))
    return buckets


def dwell_buckets(cumulative: list[int], bounds: tuple[int, ...], count: int) -> list[Bucket]:
    """A histogram's cumulative counts as buckets a person reads: "1 min to 5 min: 3"."""
    buckets, below, lower = [], 0, "0 s"
    for bound, n in zip(bounds, cumulative, strict=True):
        upper = duration_text(bound)
        buckets.append(Bucket(f"{lower} to {upper}", n - below))
        below, lower = n, upper
    buckets.append(Bucket(f"over {lower}", count - below))
    return buckets


@dataclass
class Trend:
    hours: list[datetime]
    series: dict[str, list[int]]  # label -> one count per hour, oldest first

    @property
    def peak(self) -> int:
        return max((max(counts) for counts in self.series.values()), default=0)

    @property
    def totals(self) -> dict[str, int]:
        return {label: sum(counts) for label, counts in self.series.items()}

    @property
    def rows(self) -> list[tuple[datetime, list[int]]]:
        """Hour by hour, for the table beside the chart."""
        return [
            (hour, [counts[i] for counts in self.series.values()])
            for i, hour in enumerate(self.hours)
        ]

    @property
    def lines(self) -> list[dict[str, str]]:
        """One SVG polyline per series (points in the chart's box), with its CSS class."""
        scale = (HEIGHT - BOTTOM - TOP) / max(self.peak, 1)
        step = (WIDTH - LEFT) / max(len(self.hours) - 1, 1)
        lines = []
        for n, (label, counts) in enumerate(self.series.items()):
            points = " ".join(
                f"{LEFT + i * step:.1f},{HEIGHT - BOTTOM - count * scale:.1f}"
                for i, count in enumerate(counts)
            )
            lines.append({"label": label, "points": points, "css": f"series-{n}"})
        return lines

    @property
    def box(self) -> dict[str, int]:
        return {
            "width": WIDTH,
            "height": HEIGHT,
            "left": LEFT,
            "baseline": HEIGHT - BOTTOM,
            "top": TOP,
            "label_y": HEIGHT - 4,
            "right": WIDTH,
        }


def trend(*, tenant: Tenant, now: datetime) -> Trend:
    """Counts per hour of the last 24 hours, from the partial index of counted events."""
    current = now.replace(minute=0, second=0, microsecond=0)
    hours = [current - timedelta(hours=TREND_HOURS - 1 - i) for i in range(TREND_HOURS)]
    series = {label: [0] * TREND_HOURS for _, label in TREND_SERIES}
    labels = dict(TREND_SERIES)
    index = {hour: i for i, hour in enumerate(hours)}
    rows = (
        Event.objects.filter(tenant=tenant, event_type__in=labels.keys(), occurred_at__gte=hours[0])
        .annotate(hour=TruncHour("occurred_at"))
        .values_list("event_type", "hour")
        .annotate(n=Count("*"))
        .order_by()
    )
    for event_type, hour, n in rows:
        if hour in index:
            series[labels[event_type]][index[hour]] = n
    return Trend(hours, series)
