"""A poll of the run page answers 204 when nothing changed, from the query that reads the run:
its latest event's sequence number comes with it (selectors.run_for_page)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import Event, Run, Tenant, User
from tests.helpers import logged_in

HTMX = {"HX-Request": "true"}


def test_an_unchanged_poll_reads_the_run_and_its_last_event_in_one_query(
    run: Run, viewer: User
) -> None:
    client = logged_in(viewer)
    last = Event.objects.filter(run=run).order_by("-seq").first().seq
    client.get(f"/runs/{run.pk}/", {"seen": last}, headers=HTMX)  # the person read once
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/runs/{run.pk}/", {"seen": last}, headers=HTMX)

    assert response.status_code == 204
    reads = [q["sql"] for q in captured.captured_queries if '"runs_event"' in q["sql"]]
    assert len(reads) == 1
    assert 'FROM "runs_run"' in reads[0]


def test_a_poll_after_a_new_event_shows_it(run: Run, tenant: Tenant, viewer: User) -> None:
    client = logged_in(viewer)
    last = Event.objects.filter(run=run).order_by("-seq").first().seq
    services.decision_record(tenant=tenant, run_id=run.pk, kind="later", content={}, actor="t")

    response = client.get(f"/runs/{run.pk}/", {"seen": last}, headers=HTMX)

    assert response.status_code == 200
    assert f'"seen": "{last + 1}"' in response.content.decode()
    assert b"later" in response.content
