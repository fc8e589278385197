"""The management commands that create tenants, people and API keys."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from runs.models import ApiKey, Tenant, User
from tests.helpers import ApiClient


def manage(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_it_creates_a_tenant_once(db: None) -> None:
    out, _ = manage("create_tenant", "acme", "--name", "Acme Parts")
    assert "Created tenant acme" in out
    assert Tenant.objects.get(slug="acme").name == "Acme Parts"
    with pytest.raises(CommandError, match="exists already"):
        manage("create_tenant", "acme", "--name", "Again")


def test_it_creates_a_user_with_a_role(tenant: Tenant) -> None:
    out, _ = manage(
        "create_user",
        "alice",
        "--tenant",
        "acme",
        "--role",
        "approver",
        "--password",
        "correct-horse-battery",
    )
    assert "Created approver alice" in out
    user = User.objects.get(username="alice")
    assert (user.tenant, user.role) == (tenant, "approver")
    assert user.check_password("correct-horse-battery")


def test_it_refuses_an_unknown_tenant(db: None) -> None:
    with pytest.raises(CommandError, match="create it with create_tenant"):
        manage("create_user", "bob", "--tenant", "nope", "--role", "viewer", "--password", "x")


def test_it_prints_a_working_api_key_once_and_stores_its_hash(tenant: Tenant) -> None:
    token, err = manage(
        "create_api_key", "--tenant", "acme", "--name", "refund agent", "--scope", "*"
    )
    token = token.strip()
    key = ApiKey.objects.get()
    assert "shown only once" in err
    assert token.startswith(key.pk + ".")
    assert token.split(".", 1)[1] not in key.secret_hash
    assert ApiClient(token).post("/api/v1/runs", {"title": "t"}).status_code == 201


def test_a_key_can_name_the_person_it_acts_for(tenant: Tenant, viewer: User) -> None:
    manage("create_api_key", "--tenant", "acme", "--principal", "victor", "--scope", "*")
    assert ApiKey.objects.get().principal == viewer
    with pytest.raises(CommandError, match="No user"):
        manage("create_api_key", "--tenant", "acme", "--principal", "nobody", "--scope", "*")


def test_a_key_gets_every_scope_given_and_an_expiry(tenant: Tenant) -> None:
    _, err = manage(
        "create_api_key",
        "--tenant",
        "acme",
        "--scope",
        "payments.refund",
        "--scope",
        "orders.*",
        "--scope",
        "send-email-v1",
        "--expires-at",
        "2031-01-31T12:00:00Z",
    )
    key = ApiKey.objects.get()
    assert key.scopes == ["payments.refund", "orders.*", "send-email-v1"]
    assert key.expires_at.isoformat() == "2031-01-31T12:00:00+00:00"
    assert "payments.refund, orders.*, send-email-v1" in err


def test_a_key_needs_a_scope(tenant: Tenant) -> None:
    with pytest.raises(CommandError, match="--scope"):
        manage("create_api_key", "--tenant", "acme")
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize(
    "scope", ["payments", "Payments.refund", "payments.refund.*", "*.read", ""]
)
def test_it_refuses_a_scope_that_names_nothing_it_can_match(tenant: Tenant, scope: str) -> None:
    with pytest.raises(CommandError, match="scope"):
        manage("create_api_key", "--tenant", "acme", "--scope", scope)
    assert not ApiKey.objects.exists()


def test_it_refuses_an_expiry_it_cannot_read_or_in_the_past(tenant: Tenant) -> None:
    for expiry in ("next week", "2020-01-01T00:00:00Z"):
        with pytest.raises(CommandError, match="--expires-at"):
            manage("create_api_key", "--tenant", "acme", "--scope", "*", "--expires-at", expiry)
    assert not ApiKey.objects.exists()
