"""Console pages: login, the tenant's runs, one run's timeline; tenants never see each other."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import Event, Run, Tenant, User
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


def make_runs(tenant: Tenant, titles: list[str]) -> None:
    for title in titles:
        services.run_start(tenant=tenant, title=title, actor="test")


def test_the_runs_list_filters_by_state_and_searches_titles(tenant: Tenant, viewer: User) -> None:
    make_runs(tenant, ["Refund order-001", "Refund order-002", "Replace the part of order-009"])
    Run.objects.filter(title="Refund order-002").update(state=Run.State.COMPLETED)
    client = logged_in(viewer)
    page = client.get("/runs/", {"q": "refund"}).content.decode()
    assert "Refund order-001" in page and "Refund order-002" in page
    assert "Replace the part" not in page
    page = client.get("/runs/", {"q": "refund", "state": "completed"}).content.decode()
    assert "Refund order-002" in page and "Refund order-001" not in page
    assert "1 run matches" in page
    nothing = client.get("/runs/", {"q": "no such title"}).content.decode()
    assert "No run matches these filters" in nothing


def test_the_runs_list_links_by_title_and_pages_instead_of_cutting_off(
    tenant: Tenant, viewer: User
) -> None:
    make_runs(tenant, [f"Run number {n:03d}" for n in range(60)])
    client = logged_in(viewer)
    first = client.get("/runs/").content.decode()
    newest = Run.objects.filter(tenant=tenant).order_by("-id").first()
    assert f'<a href="/runs/{newest.pk}/">Run number 059</a>' in first
    assert "60 runs" in first and "page 1 of 2" in first
    second = client.get("/runs/", {"page": 2}).content.decode()
    assert "Run number 000" in second and "Run number 059" not in second
    assert "hx-get" not in second.split('id="run-rows"')[1].split(">")[0]  # only page 1 polls


def test_the_runs_list_costs_the_same_queries_at_any_size(tenant: Tenant, viewer: User) -> None:
    client = logged_in(viewer)
    client.get("/runs/")  # the session and the user are read once, not counted below

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/runs/").status_code == 200
        return len(captured.captured_queries)

    make_runs(tenant, ["a", "b"])
    few = queries()
    make_runs(tenant, [f"run {n}" for n in range(70)])
    assert queries() == few


def test_a_run_page_poll_sends_nothing_when_nothing_changed(run: Run, viewer: User) -> None:
    client = logged_in(viewer)
    last = Event.objects.filter(run=run).order_by("-seq").first().seq
    unchanged = client.get(f"/runs/{run.pk}/", {"seen": last}, headers={"HX-Request": "true"})
    assert (unchanged.status_code, unchanged.content) == (204, b"")
    services.decision_record(tenant=run.tenant, run_id=run.pk, kind="k", content={}, actor="t")
    changed = client.get(f"/runs/{run.pk}/", {"seen": last}, headers={"HX-Request": "true"})
    assert changed.status_code == 200
    assert f'"seen": "{last + 1}"' in changed.content.decode()


def test_the_run_page_says_who_runs_it_for_how_long_and_folds_each_calls_steps(
    agent, viewer: User, sandbox
) -> None:
    from tests.helpers import propose
    from tests.toolcalls.inline_worker import run_due

    call = propose(agent)
    run_due()
    page = logged_in(viewer).get(f"/runs/{call['run_id']}/").content.decode()
    assert "<dt>Agent</dt><dd>agent for agent-owner (key key_" in page
    assert "running for" in page
    # The call's later steps are folded under its first event.
    assert "more steps of this call, last: tool_call.confirmed_success" in page
