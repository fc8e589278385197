from __future__ import annotations

import importlib

from django.test import Client

from approvals.models import Approval
from runs.models import User
from tests.helpers import BIG_REFUND, PASSWORD, ApiClient, propose
from tests.sandbox_process import Sandbox


def test_a_decision_without_a_csrf_token_is_refused(
    agent: ApiClient, approver: User, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = Approval.objects.get(tool_call_id=call["tool_call_id"])
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)
    response = client.post(
        f"/approvals/{approval.pk}/approve/",
        {"version": approval.version, "summary_hash": approval.summary_hash},
    )
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.state == "pending"


def test_repeated_failed_logins_lock_the_account(approver: User, settings) -> None:
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/login/", {"username": "alice", "password": "wrong"})
    response = client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 429
    assert "locked" in response.content.decode().lower()
    assert "_auth_user_id" not in client.session


def test_production_cookies_are_secure_and_http_only() -> None:
    production = importlib.import_module("config.settings.production")
    assert production.SESSION_COOKIE_SECURE is True
    assert production.SESSION_COOKIE_HTTPONLY is True
    assert production.CSRF_COOKIE_SECURE is True
    assert production.DEBUG is False
