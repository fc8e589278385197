"""Each console request reads the signed-in person with their tenant in one query, the session's
own (runs/sessions.py, runs/backends.py): every page names the tenant."""

from __future__ import annotations

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs.models import Run, User
from tests.helpers import PASSWORD, logged_in


def _queries(client: Client, path: str) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200
    return [q["sql"] for q in captured.captured_queries]


def test_a_page_reads_the_person_and_their_tenant_in_one_query(run: Run, viewer: User) -> None:
    queries = _queries(logged_in(viewer), f"/runs/{run.pk}/")

    # One hand-written statement (runs/sql.py, session_read); no other read of the person.
    people = [sql for sql in queries if "runs_user" in sql.split("WHERE")[0]]
    assert len(people) == 1
    assert "FROM runs_session s LEFT JOIN runs_user u ON u.id = s.user_id" in people[0]
    assert "LEFT JOIN runs_tenant t" in people[0]
    assert not [sql for sql in queries if sql.startswith('SELECT "runs_tenant"')]
    assert viewer.tenant.name in _page(logged_in(viewer), "/runs/")


def test_a_person_who_signs_in_with_a_password_gets_the_same(run: Run, viewer: User) -> None:
    client = Client()
    response = client.post("/login/", {"username": viewer.username, "password": PASSWORD})
    assert response.status_code == 302

    queries = _queries(client, f"/runs/{run.pk}/")

    assert not [sql for sql in queries if sql.startswith('SELECT "runs_tenant"')]
    # The sign-in's session row names the person: the session's read loads them.
    people = [sql for sql in queries if "runs_user" in sql.split("WHERE")[0]]
    assert len(people) == 1 and "FROM runs_session s" in people[0]


def _page(client: Client, path: str) -> str:
    return client.get(path).content.decode()
