"""The run page reads its run, with the API key and the key's person and its latest event's
sequence number, by one written-out statement (runs/sql.py run_for_page) that reads what the
ORM's select_related and subquery read (selectors.run_for_page_orm)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import selectors, services, sql
from runs.models import Event, Run, Tenant, User
from runs.services import api_key_issue

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="runs/sql.py run_for_page is PostgreSQL's"
)


def _values(obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _read(run: Run) -> tuple:
    key = run.api_key
    return (_values(run), run.last_seq, _values(key), key and _values(key.principal))


def test_it_reads_what_the_orm_reads(tenant: Tenant, other_tenant: Tenant, owner: User) -> None:
    person_key, _ = api_key_issue(tenant=tenant, name="agent", principal=owner, scopes=["*"])
    bare_key, _ = api_key_issue(tenant=tenant, name="no person", scopes=["*"])
    runs = []
    for title, key in (("with a person", person_key), ("no person", bare_key), ("no key", None)):
        run, _ = services.run_start(tenant=tenant, title=title, actor="t", api_key=key)
        runs.append(run)
    services.decision_record(tenant=tenant, run_id=runs[0].pk, kind="k", content={}, actor="t")
    # A run whose row was made without the service has no event: its last_seq is 0.
    runs.append(Run.objects.create(tenant=tenant, title="no events"))
    for run in runs:
        with CaptureQueriesContext(connection) as queries:
            read = sql.run_for_page(tenant.pk, run.pk)
            ours = _read(read)  # no further query
        assert len(queries) == 1
        assert ours == _read(selectors.run_for_page_orm(tenant=tenant, run_id=run.pk))
    first, second, third, fourth = (sql.run_for_page(tenant.pk, run.pk) for run in runs)
    assert first.last_seq == Event.objects.filter(run=runs[0]).count() > 1
    assert first.api_key.principal.username == owner.username
    assert second.api_key.name == "no person" and second.api_key.principal is None
    assert third.api_key is None and third.last_seq == 1
    assert fourth.last_seq == 0
    assert sql.run_for_page(other_tenant.pk, runs[0].pk) is None
    assert sql.run_for_page(tenant.pk, "run_missing") is None
