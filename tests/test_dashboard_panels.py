"""The dashboard's panels: pending approvals by age, unknowns by dwell, the 24-hour trend."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import dateformat, timezone

from approvals.models import Approval
from console import dashboard, metrics
from runs.models import Event, Run, Tenant, User
from tests.helpers import BIG_REFUND, REFUND, fresh, logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import dispatch


def counts(buckets: list[dashboard.Bucket]) -> dict[str, int]:
    return {bucket.label: bucket.count for bucket in buckets}


def test_pending_approvals_are_counted_by_how_long_they_waited(
    tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    calls = [
        propose_in(run, {**BIG_REFUND, "amount_cents": 20_100 + n}, intent=f"i{n}")
        for n in range(3)
    ]
    now = timezone.now()
    ages = (timedelta(minutes=1), timedelta(hours=2), timedelta(days=1))
    for call, age in zip(calls, ages, strict=True):
        Approval.objects.filter(tool_call=call).update(created_at=now - age)
    ages = counts(dashboard.approvals_by_age(tenant=tenant, now=now))
    assert ages == {
        "0 s to 5 min": 1,
        "5 min to 1 h": 0,
        "1 h to 4 h": 1,
        "4 h to 12 h": 0,
        "over 12 h": 1,
    }


def test_unknown_calls_are_counted_by_how_long_they_have_been_unknown(
    tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    sandbox.faults(system="payments", drop_response_after_commit=1.0, times=1)
    call = propose_in(run, REFUND)
    dispatch.tool_call_dispatch(tool_call_id=call.pk)
    assert fresh(call).execution_status == "result_unknown"
    entered = Event.objects.get(tool_call_id=call.pk, event_type="tool_call.result_unknown")

    def dwell(after: timedelta) -> dict[str, int]:
        histogram = metrics.collect(tenant=tenant, now=entered.occurred_at + after)[
            "acme"
        ].unknown_dwell
        return counts(
            dashboard.dwell_buckets(histogram.cumulative, histogram.bounds, histogram.count)
        )

    assert dwell(timedelta(seconds=10))["0 s to 1 min"] == 1
    two_hours = dwell(timedelta(hours=2))
    assert two_hours["1 h to 4 h"] == 1
    assert sum(two_hours.values()) == 1
    assert dwell(timedelta(days=2))["over 1 d"] == 1


def test_the_trend_counts_each_hour_of_the_last_day(
    tenant: Tenant, run: Run, sandbox: Sandbox
) -> None:
    sent = propose_in(run, REFUND, intent="sent")
    dispatch.tool_call_dispatch(tool_call_id=sent.pk)
    propose_in(run, {**REFUND, "amount_cents": 100}, intent="held")
    now = timezone.now()
    trend = dashboard.trend(tenant=tenant, now=now)
    assert len(trend.hours) == 24
    assert trend.series["proposed"][-1] == 2
    assert trend.series["dispatched"][-1] == 1
    assert trend.totals == {"proposed": 2, "dispatched": 1, "answer lost": 0}
    a_day_later = dashboard.trend(tenant=tenant, now=now + timedelta(hours=25))
    assert a_day_later.totals == {"proposed": 0, "dispatched": 0, "answer lost": 0}


def test_the_dashboard_draws_the_trend_as_an_accessible_svg_with_a_table(
    admin_user: User, run: Run, sandbox: Sandbox
) -> None:
    dispatch.tool_call_dispatch(tool_call_id=propose_in(run, REFUND).pk)
    page = logged_in(admin_user).get("/dashboard/").content.decode()
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert 'role="img"' in svg and 'aria-labelledby="trend-title trend-desc"' in svg
    assert "<title" in svg and "<desc" in svg
    assert len(re.findall(r"<polyline points=", svg)) == 3
    assert "Hour by hour" in page
    assert "1 proposed, 1 dispatched, 0 answer lost" in page
    assert 'id="approvals-by-age"' in page and 'id="unknowns-by-dwell"' in page


def test_the_chart_and_its_table_are_drawn_from_the_counts_in_the_current_time_zone() -> None:
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    hours = [now - timedelta(hours=23 - i) for i in range(24)]
    series = {"proposed": [0] * 23 + [4], "dispatched": [0] * 24, "answer lost": [2] + [0] * 23}
    trend = dashboard.Trend(hours, series)
    # Not UTC, and not a whole hour from it: a time left unconverted would show.
    with timezone.override("Asia/Kolkata"):
        svg, table = str(trend.svg()), str(trend.hour_rows())
        first = timezone.localtime(hours[0])
    # The peak touches the top of the box (y 8), zero lies on the baseline (y 140).
    assert 'points="36.0,140.0' in svg and "480.0,8.0" in svg and "36.0,74.0" in svg
    assert '<text x="32" y="16" text-anchor="end" class="tick">4</text>' in svg
    assert f'<text x="36" y="156" class="tick">{first:%H:%M}</text>' in svg
    assert "4 proposed, 0 dispatched, 2 answer lost in all, at most 4 in one hour" in svg
    assert table.startswith(
        f'<tr><td data-label="Hour"><time datetime="{dateformat.format(first, "c")}">'
        f"{dateformat.format(first, 'H:i')}</time></td><td>0</td><td>0</td><td>2</td></tr>"
    )
    assert table.count("<tr>") == 24
