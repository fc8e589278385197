"""Approval latency, kept as counts: from an approval's creation to the `approval.approved`
or `approval.rejected` event that decided it (what /metrics reported before, recomputed per
request over every decision).

`latency_record` adds one decision to its tenant's bucket in the deciding transaction (one
upsert on a row per tenant and bucket: people decide at human pace, so the row is never hot).
`recount` computes the counts again from the log's decisions and the approvals' creation
times (archived approvals included, from their `_archive` table), `rebuild_projections
--verify` compares, and `rebuild` (which the table's migration ran) replaces them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from itertools import chain

from django.db import DEFAULT_DB_ALIAS, connection, connections

from approvals.models import Approval, ApprovalLatency
from runs import pipeline
from runs.models import Event

# People decide in seconds to hours; beyond a day an approval has usually expired.
BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)
DECIDED = ("approval.approved", "approval.rejected")
MICROSECOND = timedelta(microseconds=1)

Counts = dict[tuple[int, int], tuple[int, int]]  # (tenant id, bucket) -> (count, total µs)


def bucket_of(latency_us: int) -> int:
    """The first bound the latency is within (at most), or len(BUCKETS) past the last."""
    return sum(1 for bound in BUCKETS if latency_us > bound * 1_000_000)


def _latency_us(required_at: datetime, decided_at: datetime) -> int:
    return (decided_at - required_at) // MICROSECOND


def latency_record(*, approval: Approval, decided: Event) -> None:
    """Count one decision; call it in the transaction that appended `decided`."""
    latency = _latency_us(approval.created_at, decided.occurred_at)
    pipeline.write(
        connections[DEFAULT_DB_ALIAS],
        "INSERT INTO approvals_approvallatency (tenant_id, bucket, count, total_us)"
        " VALUES (%s, %s, 1, %s) ON CONFLICT (tenant_id, bucket) DO UPDATE SET"
        " count = approvals_approvallatency.count + 1,"
        " total_us = approvals_approvallatency.total_us + EXCLUDED.total_us",
        [decided.tenant_id, bucket_of(latency), latency],
    )


ARCHIVE = "approvals_approval_archive"  # memory/archive.py moves archived runs' rows there


def _created(approval_ids: list[str]) -> dict[str, datetime]:
    created = dict(Approval.objects.filter(pk__in=approval_ids).values_list("id", "created_at"))
    missing = [approval_id for approval_id in approval_ids if approval_id not in created]
    if missing and ARCHIVE in connection.introspection.table_names():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT id, created_at FROM {ARCHIVE} WHERE id = ANY(%s)", [missing])
            created.update(cursor.fetchall())
    return created


def recount() -> Counts:
    """The counts as the log's decisions say them, a chunk of decisions at a time."""
    decided = (
        Event.objects.filter(event_type__in=DECIDED)
        .exclude(approval_id="")
        .order_by("id")
        .values_list("tenant_id", "approval_id", "occurred_at")
    )
    counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    chunk: list[tuple[int, str, datetime]] = []
    for row in chain(decided.iterator(chunk_size=2000), [None]):
        if row is not None:
            chunk.append(row)
        if chunk and (row is None or len(chunk) == 2000):
            created = _created([approval_id for _, approval_id, _ in chunk])
            for tenant_id, approval_id, occurred_at in chunk:
                if approval_id in created:
                    latency = _latency_us(created[approval_id], occurred_at)
                    entry = counts[(tenant_id, bucket_of(latency))]
                    entry[0] += 1
                    entry[1] += latency
            chunk = []
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
