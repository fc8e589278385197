"""Admins change people's roles and issue and revoke API keys on /people/; each change goes
through a runs service that records an admin event, and the key's secret is shown once."""

from __future__ import annotations

import pytest
from django.test import Client

from runs.admin_event_models import AdminEvent
from runs.models import ApiKey, Tenant, User
from tests.helpers import ApiClient, logged_in, make_user


@pytest.fixture
def admin(admin_user: User) -> Client:
    return logged_in(admin_user)


def test_an_admin_makes_a_viewer_an_approver_and_it_is_recorded(
    admin: Client, viewer: User
) -> None:
    response = admin.post(f"/people/{viewer.username}/role/", {"role": "approver"})
    assert response.status_code == 302
    viewer.refresh_from_db()
    assert viewer.role == "approver"
    event = AdminEvent.objects.get(event_type="user.role_changed")
    assert (event.actor, event.subject, event.payload) == (
        "user:olivia",
        "user:victor",
        {"from": "viewer", "to": "approver"},
    )
    page = admin.get("/people/").content.decode()
    assert 'id="role-victor"' in page and '<option value="approver" selected>' in page
    assert "victor: role viewer → approver" in page  # under "Recent changes"


def test_an_admin_cannot_drop_their_own_admin_role(admin: Client, admin_user: User) -> None:
    response = admin.post(f"/people/{admin_user.username}/role/", {"role": "viewer"})
    assert response.status_code == 409
    assert "cannot take away your own admin role" in response.content.decode()
    admin_user.refresh_from_db()
    assert admin_user.role == "admin" and not AdminEvent.objects.exists()


def test_an_unknown_role_or_another_tenants_person_is_refused(
    admin: Client, viewer: User, other_tenant: Tenant
) -> None:
    assert admin.post("/people/victor/role/", {"role": "root"}).status_code == 409
    stranger = make_user("gary", other_tenant, User.Role.VIEWER)
    assert admin.post(f"/people/{stranger.username}/role/", {"role": "admin"}).status_code == 404
    stranger.refresh_from_db()
    assert stranger.role == "viewer"


def test_approvers_change_no_roles_and_issue_no_keys(approver: User, viewer: User) -> None:
    client = logged_in(approver)
    assert client.post("/people/victor/role/", {"role": "admin"}).status_code == 403
    assert client.post("/people/keys/issue/", {"name": "x", "scopes": "*"}).status_code == 403
    assert not ApiKey.objects.exists()


def test_a_key_is_issued_with_its_secret_shown_once_and_it_works(
    admin: Client, approver: User, tenant: Tenant
) -> None:
    response = admin.post(
        "/people/keys/issue/",
        {
            "name": "refund bot",
            "scopes": "payments.refund, orders.read",
            "principal": "alice",
            "expires_in_days": "30",
        },
    )
    # Post/Redirect/Get: the token is on the page the redirect leads to, once.
    assert (response.status_code, response["Location"]) == (302, "/people/")
    response = admin.get("/people/")
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]
    key = ApiKey.objects.get(name="refund bot")
    page = response.content.decode()
    token = page.split('<code id="issued-token">')[1].split("</code>")[0]
    assert token.startswith(f"{key.pk}.")
    assert key.scopes == ["payments.refund", "orders.read"]
    assert key.principal == approver and key.expires_at is not None
    assert AdminEvent.objects.get(event_type="api_key.issued").subject == f"api_key:{key.pk}"
    # The secret is never shown again; the key's last use appears once an agent uses it.
    later = admin.get("/people/").content.decode()
    assert token not in later and "never" in later
    assert ApiClient(token).get("/api/v1/capabilities").status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert key.last_used_at.strftime("%Y-%m-%d %H:%M") in admin.get("/people/").content.decode()


def test_refreshing_after_issuing_a_key_issues_no_second_key_and_hides_the_token(
    admin: Client,
) -> None:
    """What a browser does: the POST answered with a redirect, the person presses refresh on
    the page it led to (a GET), then again."""
    form = {"name": "bot", "scopes": "orders.read"}
    issued = admin.post("/people/keys/issue/", form, follow=True)
    page = issued.content.decode()
    assert issued.redirect_chain == [("/people/", 302)]
    token = page.split('<code id="issued-token">')[1].split("</code>")[0]
    refreshed = admin.get(issued.request["PATH_INFO"]).content.decode()
    assert ApiKey.objects.filter(name="bot").count() == 1
    assert token not in refreshed and 'id="issued-token"' not in refreshed
    assert AdminEvent.objects.filter(event_type="api_key.issued").count() == 1


def test_a_scope_that_names_nothing_is_refused_and_what_was_typed_stays(admin: Client) -> None:
    response = admin.post("/people/keys/issue/", {"name": "bot", "scopes": "payments.refnud"})
    assert response.status_code == 422
    page = response.content.decode()
    assert "names no capability" in page and 'value="payments.refnud"' in page
    assert not ApiKey.objects.exists()


def test_revoking_a_key_refuses_it_and_is_recorded(admin: Client, agent: ApiClient) -> None:
    assert agent.get("/api/v1/capabilities").status_code == 200
    response = admin.post(f"/people/keys/{agent.key.pk}/revoke/")
    assert response.status_code == 302
    assert agent.get("/api/v1/capabilities").status_code == 401
    assert AdminEvent.objects.get(event_type="api_key.revoked").subject == f"api_key:{agent.key.pk}"
    admin.post(f"/people/keys/{agent.key.pk}/revoke/")  # twice: recorded once
    assert AdminEvent.objects.filter(event_type="api_key.revoked").count() == 1


def test_another_tenants_key_cannot_be_revoked(admin: Client, other_agent: ApiClient) -> None:
    key_id = ApiKey.objects.get(name="other agent").pk
    assert admin.post(f"/people/keys/{key_id}/revoke/").status_code == 404
    assert other_agent.get("/api/v1/capabilities").status_code == 200
