"""The dashboard's panels beyond /metrics: pending approvals by age, and the last 24 hours
hour by hour (calls proposed, dispatched, and answers lost), drawn as an inline SVG on the
server. Each is one grouped query over an index (console/sql.py on PostgreSQL); nothing is
kept in memory between requests.

The chart and its table are written here as HTML strings, once per request: as template
code they were about 150 variable look-ups, a date filter per hour and a loop per hour,
re-rendered every 5 seconds while a dashboard is open. Every value in them is a number, a
time or one of the series' labels below: nothing a person typed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Q
from django.db.models.functions import TruncHour
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from approvals.models import Approval
from console import sql
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
BASELINE, LABEL_Y = HEIGHT - BOTTOM, HEIGHT - 4


@dataclass
class Bucket:
    label: str
    count: int


def approvals_by_age(*, tenant: Tenant, now: datetime) -> list[Bucket]:
    """Pending approvals by how long they have waited: under 5 min, 5 min to 1 h, …"""
    moments = [now - timedelta(seconds=bound) for bound in APPROVAL_AGE_BUCKETS]
    if connection.vendor == "postgresql":
        total, newer = sql.pending_approvals_newer_than(tenant_id=tenant.pk, moments=moments)
    else:
        total, newer = pending_approvals_newer_than_orm(tenant=tenant, moments=moments)
    return dwell_buckets(newer, APPROVAL_AGE_BUCKETS, total)


def pending_approvals_newer_than_orm(
    *, tenant: Tenant, moments: list[datetime]
) -> tuple[int, list[int]]:
    """What console/sql.py reads on PostgreSQL, through the ORM."""
    counts = {
        # Counts of created_at (never null) and COUNT(*), not of id: with created_at in
        # approval_changed, that index alone answers it (10,000 pending, no table reads).
        f"b{i}": Count("created_at", filter=Q(created_at__gt=moment))
        for i, moment in enumerate(moments)
    }
    row = Approval.objects.filter(tenant=tenant, state=Approval.State.PENDING).aggregate(
        n=Count("*"), **counts
    )
    return row["n"], [row[f"b{i}"] for i in range(len(moments))]


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
    def summary(self) -> str:
        """What the chart counted: "2 proposed, 1 dispatched, 0 answer lost"."""
        return ", ".join(f"{n} {label}" for label, n in self.totals.items())

    def points(self) -> list[str]:
        """Each series' SVG polyline points, in the chart's box."""
        scale = (BASELINE - TOP) / max(self.peak, 1)
        step = (WIDTH - LEFT) / max(len(self.hours) - 1, 1)
        return [
            " ".join(
                f"{LEFT + i * step:.1f},{BASELINE - count * scale:.1f}"
                for i, count in enumerate(counts)
            )
            for counts in self.series.values()
        ]

    def svg(self) -> SafeString:
        """The chart: its axes, the peak and the first and last hour, a line per series."""
        zone = timezone.get_current_timezone()
        first, last = (self.hours[0].astimezone(zone), self.hours[-1].astimezone(zone))
        lines = "".join(
            f'<polyline points="{points}" class="series-{n}"><title>{label}</title></polyline>'
            for n, (points, label) in enumerate(zip(self.points(), self.series, strict=True))
        )
        return format_html(
            '<svg viewBox="0 0 {width} {height}" width="100%" role="img"'
            ' aria-labelledby="trend-title trend-desc" class="trend">\n'
            '<title id="trend-title">Tool calls per hour, last 24 hours</title>\n'
            '<desc id="trend-desc">Calls proposed, dispatched and with a lost answer in each of'
            " the last 24 hours: {summary} in all, at most {peak} in one hour. The table below"
            " has every hour.</desc>\n"
            '<line x1="{left}" y1="{baseline}" x2="{width}" y2="{baseline}" class="axis"/>\n'
            '<line x1="{left}" y1="{top}" x2="{left}" y2="{baseline}" class="axis"/>\n'
            '<text x="{tick_x}" y="{peak_y}" text-anchor="end" class="tick">{peak}</text>\n'
            '<text x="{tick_x}" y="{baseline}" text-anchor="end" class="tick">0</text>\n'
            '<text x="{left}" y="{label_y}" class="tick">{first}</text>\n'
            '<text x="{width}" y="{label_y}" text-anchor="end" class="tick">{last}</text>\n'
            "{lines}\n</svg>",
            width=WIDTH,
            height=HEIGHT,
            left=LEFT,
            top=TOP,
            baseline=BASELINE,
            label_y=LABEL_Y,
            tick_x=LEFT - 4,
            peak_y=TOP + 8,
            summary=self.summary,
            peak=self.peak,
            first=first.strftime("%H:%M"),
            last=last.strftime("%H:%M"),
            lines=mark_safe(lines),  # numbers and the series' own labels
        )

    def legend(self) -> SafeString:
        spans = (
            f'<span class="series-{n}">■</span> {label} ' for n, label in enumerate(self.series)
        )
        return mark_safe("".join(spans))  # the series' own labels

    def hour_rows(self) -> SafeString:
        """The chart's table: a row per hour, its time and its count in each series."""
        zone = timezone.get_current_timezone()
        columns = list(self.series.values())
        rows = []
        for i, hour in enumerate(self.hours):
            local = hour.astimezone(zone)
            cells = "".join(f"<td>{counts[i]}</td>" for counts in columns)
            rows.append(
                f'<tr><td data-label="Hour"><time datetime="{local.isoformat()}">'
                f"{local.strftime('%H:%M')}</time></td>{cells}</tr>"
            )
        return mark_safe("".join(rows))  # times and numbers only


def trend(*, tenant: Tenant, now: datetime) -> Trend:
    """Counts per hour of the last 24 hours, from the partial index of counted events."""
    current = now.replace(minute=0, second=0, microsecond=0)
    hours = [current - timedelta(hours=TREND_HOURS - 1 - i) for i in range(TREND_HOURS)]
    series = {label: [0] * TREND_HOURS for _, label in TREND_SERIES}
    labels = dict(TREND_SERIES)
    index = {hour: i for i, hour in enumerate(hours)}
    if connection.vendor == "postgresql":
        rows = sql.events_per_hour(tenant_id=tenant.pk, event_types=list(labels), since=hours[0])
    else:
        rows = events_per_hour_orm(tenant=tenant, event_types=list(labels), since=hours[0])
    for event_type, hour, n in rows:
        if hour in index:
            series[labels[event_type]][index[hour]] = n
    return Trend(hours, series)


def events_per_hour_orm(
    *, tenant: Tenant, event_types: list[str], since: datetime
) -> list[tuple[str, datetime, int]]:
    """What console/sql.py reads on PostgreSQL, through the ORM."""
    return list(
        Event.objects.filter(tenant=tenant, event_type__in=event_types, occurred_at__gte=since)
        .annotate(hour=TruncHour("occurred_at"))
        .values_list("event_type", "hour")
        .annotate(n=Count("*"))
        .order_by()
    )
