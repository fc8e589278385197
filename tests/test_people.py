"""A tenant's admin sees who is locked out of logging in and unlocks them, and sees the
tenant's API keys with their scopes and expiry (/people/)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from django.test import Client

from runs.models import Tenant, User
from runs.services import api_key_issue, api_key_revoke
from tests.helpers import PASSWORD, logged_in, make_user


def log_in(username: str, password: str) -> int:
    response = Client().post("/login/", {"username": username, "password": password})
    return response.status_code


@pytest.fixture
def alice_locked(approver: User, settings: object) -> User:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in("alice", "wrong")
    assert log_in("alice", PASSWORD) == 429
    return approver


def test_the_people_page_shows_alice_locked(alice_locked: User, admin_user: User) -> None:
    page = logged_in(admin_user).get("/people/").content.decode()
    assert "locked from 1 address" in page
    assert "/people/alice/unlock/" in page


def test_an_admin_unlocks_alice_and_she_can_log_in(
    alice_locked: User, admin_user: User, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="runs.lockout"):
        response = logged_in(admin_user).post("/people/alice/unlock/")
    assert response.status_code == 302
    assert log_in("alice", PASSWORD) == 302
    assert "olivia unlocked alice of tenant acme" in caplog.text


def test_a_viewer_cannot_unlock(alice_locked: User, viewer: User) -> None:
    assert logged_in(viewer).post("/people/alice/unlock/").status_code == 403
    assert logged_in(viewer).get("/people/").status_code == 403
    assert log_in("alice", PASSWORD) == 429


def test_another_tenants_admin_gets_404(alice_locked: User, other_tenant: Tenant) -> None:
    stranger = make_user("gary", other_tenant, User.Role.ADMIN)
    assert logged_in(stranger).post("/people/alice/unlock/").status_code == 404
    assert log_in("alice", PASSWORD) == 429


def test_unlocking_needs_a_post(alice_locked: User, admin_user: User) -> None:
    assert logged_in(admin_user).get("/people/alice/unlock/").status_code == 405
    assert log_in("alice", PASSWORD) == 429


def test_the_people_page_shows_each_key_with_its_scopes_and_expiry(
    tenant: Tenant, other_tenant: Tenant, admin_user: User
) -> None:
    api_key_issue(
        tenant=tenant,
        name="refund agent",
        scopes=["payments.refund", "orders.*"],
        expires_at=datetime(2031, 1, 31, 12, tzinfo=UTC),
    )
    revoked, _ = api_key_issue(tenant=tenant, name="old agent", scopes=["*"])
    api_key_revoke(api_key=revoked)
    api_key_issue(tenant=other_tenant, name="their agent", scopes=["*"])
    page = logged_in(admin_user).get("/people/").content.decode()
    assert "refund agent" in page
    assert "payments.refund, orders.*" in page
    assert "2031-01-31 12:00" in page
    assert "revoked" in page
    assert "their agent" not in page
