"""Console pages: login, the tenant's runs, one run's timeline; tenants never see each other."""

from __future__ import annotations

import pytest
from django.test import Client

from runs import services
from runs.models import Run, Tenant, User
from tests.helpers import PASSWORD, logged_in, make_user
from toolcalls.lifecycle import run_stop


@pytest.fixture
def run(run: Run, tenant: Tenant) -> Run:
    """The shared run, with a decision in its timeline."""
    services.decision_record(
        tenant=tenant, run_id=run.pk, kind="refund_eligibility", content={"ok": True}, actor="t"
    )
    return run


def test_the_login_page_renders(client: Client) -> None:
    response = client.get("/login/")
    assert response.status_code == 200
    assert b"Log in" in response.content


def test_it_logs_in_and_out(client: Client, approver: User) -> None:
    response = client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/"  # the start page sends an approver to the inbox
    assert client.get("/runs/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/runs/").status_code == 302


def test_anonymous_visitors_are_sent_to_login(client: Client, run: Run) -> None:
    for path in ("/runs/", f"/runs/{run.pk}/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")


def test_it_lists_the_tenants_runs(approver: User, run: Run, other_tenant: Tenant) -> None:
    services.run_start(tenant=other_tenant, title="Globex secret", actor="test")
    response = logged_in(approver).get("/runs/")
    assert run.pk.encode() in response.content
    assert b"Globex secret" not in response.content


def test_the_htmx_poll_returns_only_the_rows(approver: User, run: Run) -> None:
    response = logged_in(approver).get("/runs/", headers={"HX-Request": "true"})
    assert run.pk.encode() in response.content
    assert b"<html" not in response.content


def test_it_shows_a_runs_timeline(viewer: User, run: Run) -> None:
    response = logged_in(viewer).get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    content = response.content.decode()
    assert "run.started" in content
    assert "decision.recorded" in content
    assert "refund_eligibility" in content


def test_another_tenants_run_is_not_found(run: Run, other_tenant: Tenant) -> None:
    outsider = make_user("mallory", other_tenant, User.Role.ADMIN)
    assert logged_in(outsider).get(f"/runs/{run.pk}/").status_code == 404
    assert (
        logged_in(outsider).get(f"/runs/{run.pk}/", headers={"HX-Request": "1"}).status_code == 404
    )


def test_a_closed_runs_poll_asks_htmx_to_stop(approver: User, run: Run, tenant: Tenant) -> None:
    run_stop(tenant=tenant, run_id=run.pk, actor="test")
    response = logged_in(approver).get(f"/runs/{run.pk}/", headers={"HX-Request": "true"})
    assert response.status_code == 286
    assert b"Cancelled" in response.content


def test_a_user_without_a_tenant_is_refused(db: None) -> None:
    root = User.objects.create_superuser(username="root", password=PASSWORD)
    assert logged_in(root).get("/runs/").status_code == 403


def test_htmx_is_served_from_static(client: Client) -> None:
    page = client.get("/login/").content.decode()
    assert 'src="/static/django_htmx/htmx-2' in page or "/static/" in page
    assert "x-csrftoken" in page
    script = page.split('<script src="')[1].split('"')[0]
    assert client.get(script).status_code == 200
