"""Failed logins lock one username from one client address, read through a configured number
of trusted proxies, and the login page says how many attempts are left."""

from __future__ import annotations

from django.test import Client

from runs.models import User
from tests.helpers import PASSWORD

PROXY = "10.0.0.1"  # every request reaches Django from this address


def log_in(username: str, password: str, *, forwarded_for: str = "") -> object:
    headers = {"REMOTE_ADDR": PROXY}
    if forwarded_for:
        headers["HTTP_X_FORWARDED_FOR"] = forwarded_for
    return Client().post("/login/", {"username": username, "password": password}, **headers)


def fail_until_locked(username: str, settings: object, *, forwarded_for: str = "") -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in(username, "wrong", forwarded_for=forwarded_for)
    assert log_in(username, PASSWORD, forwarded_for=forwarded_for).status_code == 429


def test_failures_for_alice_do_not_lock_bob_behind_the_same_proxy(
    approver: User, bob: User, settings: object
) -> None:
    fail_until_locked("alice", settings)
    response = log_in("bob", PASSWORD)
    assert response.status_code == 302, response.content.decode()[:300]


def test_alice_from_another_forwarded_address_is_not_locked(
    approver: User, settings: object
) -> None:
    settings.TRUSTED_PROXY_COUNT = 1
    fail_until_locked("alice", settings, forwarded_for="203.0.113.5")
    assert log_in("alice", PASSWORD, forwarded_for="198.51.100.7").status_code == 302


def test_a_forged_forwarded_address_does_not_escape_the_lock(
    approver: User, settings: object
) -> None:
    # The proxy appends the address it saw; what the client wrote before it is not trusted.
    settings.TRUSTED_PROXY_COUNT = 1
    fail_until_locked("alice", settings, forwarded_for="203.0.113.5")
    forged = log_in("alice", PASSWORD, forwarded_for="198.51.100.7, 203.0.113.5")
    assert forged.status_code == 429


def test_without_trusted_proxies_the_forwarded_header_is_ignored(
    approver: User, settings: object
) -> None:
    fail_until_locked("alice", settings, forwarded_for="203.0.113.5")
    assert log_in("alice", PASSWORD, forwarded_for="198.51.100.7").status_code == 429


def test_the_login_page_says_how_many_attempts_are_left(approver: User, settings: object) -> None:
    settings.AXES_FAILURE_LIMIT = 5
    settings.AXES_COOLOFF_TIME = 0.25
    for _ in range(2):
        log_in("alice", "wrong")
    page = log_in("alice", "wrong").content.decode()
    assert "2 attempts left before this account is locked for 15 minutes from this address" in page
    page = log_in("alice", "wrong").content.decode()
    assert "1 attempt left before this account is locked" in page
