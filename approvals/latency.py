"""Approval latency, kept as counts: from an approval's `approval.required` event to the
`approval.approved` or `approval.rejected` event that decided it.

`latency_record` adds one decision to its tenant's bucket in the deciding transaction (one
upsert on a row per tenant and bucket; people decide at human pace, so the row is never hot).
Since both ends are events, the counts are a function of the log: `recount` computes them
again from it (archived runs included: their events stay), `rebuild_projections --verify`
compares, and the migration that made the table filled it with `recount`.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db import connection

from approvals.models import ApprovalLatency
from runs.models import Event

# People decide in seconds to hours; beyond a day an approval has usually expired.
BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)
REQUIRED = "approval.required"
DECIDED = ("approval.approved", "approval.rejected")
MICROSECOND = timedelta(microseconds=1)

Counts = dict[tuple[int, int], tuple[int, int]]  # (tenant id, bucket) -> (count, total µs)


def bucket_of(latency_us: int) -> int:
    """The first bound the latency is within (at most), or len(BUCKETS) past the last."""
    return sum(1 for bound in BUCKETS if latency_us > bound * 1_000_000)


def _latency_us(required_at: datetime, decided_at: datetime) -> int:
    return (decided_at - required_at) // MICROSECOND


def latency_record(*, decided: Event) -> None:
    """Count one decision; call it in the transaction that appended `decided`."""
    required_at = (
        Event.objects.filter(approval_id=decided.approval_id, event_type=REQUIRED)
        .order_by("seq")
        .values_list("occurred_at", flat=True)
        .first()
    )
    if required_at is None:
        return  # not an approval the log saw required: nothing to measure from
    latency = _latency_us(required_at, decided.occurred_at)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO approvals_approvallatency (tenant_id, bucket, count, total_us)"
            " VALUES (%s, %s, 1, %s) ON CONFLICT (tenant_id, bucket) DO UPDATE SET"
            " count = approvals_approvallatency.count + 1,"
            " total_us = approvals_approvallatency.total_us + EXCLUDED.total_us",
            [decided.tenant_id, bucket_of(latency), latency],
        )


def recount() -> Counts:
    """The counts as the log says them. It holds one time per approval required and not yet
    decided in the log's order, by (approval id), so its memory is the approvals', not the
    events'."""
    events = (
        Event.objects.filter(event_type__in=(REQUIRED, *DECIDED))
        .exclude(approval_id="")
        .order_by("approval_id", "seq")
        .values_list("tenant_id", "approval_id", "event_type", "occurred_at")
    )
    counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    current, required_at = "", None
    for tenant_id, approval_id, event_type, occurred_at in events.iterator(chunk_size=5000):
        if approval_id != current:
            current, required_at = approval_id, None
        if event_type == REQUIRED:
            required_at = required_at or occurred_at
        elif required_at is not None:
            latency = _latency_us(required_at, occurred_at)
            row = counts[(tenant_id, bucket_of(latency))]
            row[0] += 1
            row[1] += latency
    return {key: (n, total) for key, (n, total) in counts.items()}


def stored() -> Counts:
    rows = ApprovalLatency.objects.filter(count__gt=0)
    return {(r.tenant_id, r.bucket): (r.count, r.total_us) for r in rows}


def verify() -> list[str]:
    """One line per bucket whose stored count differs from the log's."""
    rebuilt, kept = recount(), stored()
    return [
        f"approval_latency tenant {key[0]} bucket {key[1]}: "
        f"stored={kept.get(key, (0, 0))!r} rebuilt={rebuilt.get(key, (0, 0))!r}"
        for key in sorted(set(rebuilt) | set(kept))
        if rebuilt.get(key, (0, 0)) != kept.get(key, (0, 0))
    ]


def rebuild() -> None:
    """Replace the stored counts by the log's (the migration that made the table uses it)."""
    ApprovalLatency.objects.all().delete()
    ApprovalLatency.objects.bulk_create(
        ApprovalLatency(tenant_id=tenant_id, bucket=bucket, count=n, total_us=total)
        for (tenant_id, bucket), (n, total) in recount().items()
    )
