"""Pages people land on: the start page by role, and the error pages."""

from __future__ import annotations

from django.db import transaction
from django.test import RequestFactory
from django.views.defaults import server_error

from runs.models import Run, User
from tests.helpers import PASSWORD, logged_in, propose_in
from toolcalls import reconcile, writes


def log_in(client, user: User):
    return client.post("/login/", {"username": user.username, "password": PASSWORD})


def test_an_approver_lands_on_the_inbox(client, approver: User) -> None:
    assert log_in(client, approver)["Location"] == "/"
    assert client.get("/")["Location"] == "/approvals/"


def test_a_viewer_lands_on_the_runs(client, viewer: User) -> None:
    log_in(client, viewer)
    assert client.get("/")["Location"] == "/runs/"


def test_an_admin_lands_on_the_desk_only_when_something_waits_there(
    client, admin_user: User, run: Run, sandbox
) -> None:
    log_in(client, admin_user)
    assert client.get("/")["Location"] == "/approvals/"  # nothing on the desk: decide
    call = propose_in(run)
    with transaction.atomic():
        # Sent, then its outcome could not be found: a person must resolve it.
        locked = writes.tool_call_lock(call.pk)
        writes.tool_call_transition(locked, "claim", actor="t", producer="t")
        reconcile.tool_call_hand_to_human(call=locked, reason="look-ups exhausted", actor="t")
    assert client.get("/")["Location"] == "/desk/"


def test_a_forbidden_page_says_why_and_where_to_go(viewer: User) -> None:
    response = logged_in(viewer).get("/desk/")
    assert response.status_code == 403
    page = response.content.decode()
    assert "You can't open this page" in page
    assert 'href="/"' in page and "Viewer" in page


def test_a_missing_page_says_so_and_links_back(viewer: User) -> None:
    response = logged_in(viewer).get("/runs/run_doesnotexist/")
    assert response.status_code == 404
    page = response.content.decode()
    assert "Nothing here" in page and "/runs/run_doesnotexist/" in page
    assert 'href="/approvals/"' in page


def test_the_server_error_page_stands_alone() -> None:
    # Rendered without a database or context: it must not extend the console's base page.
    response = server_error(RequestFactory().get("/runs/"))
    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong on our side" in page
    assert "Traceback" not in page
