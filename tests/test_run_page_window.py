"""A long run's page shows its latest events, with a link to the ones before."""

from __future__ import annotations

import re

import pytest

from console.views import runs as run_views
from runs import services
from runs.models import Run, Tenant, User
from tests.helpers import logged_in


@pytest.fixture
def long_run(run: Run, tenant: Tenant, monkeypatch: pytest.MonkeyPatch) -> Run:
    """25 events (the start and 24 decisions), on a page that holds 10."""
    monkeypatch.setattr(run_views, "TIMELINE_WINDOW", 10)
    for n in range(24):
        services.decision_record(
            tenant=tenant, run_id=run.pk, kind=f"step-{n}", content={}, actor="t"
        )
    return run


def seqs(content: str) -> list[int]:
    return [int(n) for n in re.findall(r'<span class="seq">#(\d+)</span>', content)]


def test_it_shows_the_latest_events_and_links_to_the_earlier(long_run: Run, viewer: User):
    content = logged_in(viewer).get(f"/runs/{long_run.pk}/").content.decode()
    assert seqs(content) == list(range(16, 26))
    assert 'href="?before=16#timeline"' in content
    assert "15 before these" in content


def test_the_earlier_events_link_on_to_the_first(long_run: Run, viewer: User):
    client = logged_in(viewer)
    middle = client.get(f"/runs/{long_run.pk}/", {"before": 16}).content.decode()
    assert seqs(middle) == list(range(6, 16))
    assert 'href="?before=6#timeline"' in middle
    assert "Show the latest events" in middle
    first = client.get(f"/runs/{long_run.pk}/", {"before": 6}).content.decode()
    assert seqs(first) == [1, 2, 3, 4, 5]
    assert "Show earlier events" not in first


def test_a_before_it_cannot_read_shows_the_latest(long_run: Run, viewer: User):
    for before in ("x", "0", "1", "999"):
        content = logged_in(viewer).get(f"/runs/{long_run.pk}/", {"before": before})
        assert seqs(content.content.decode()) == list(range(16, 26))


def test_the_poll_of_an_earlier_window_keeps_it(long_run: Run, viewer: User):
    content = logged_in(viewer).get(f"/runs/{long_run.pk}/", {"before": 16}).content.decode()
    assert '"before": "16"' in content
