"""The Django admin's API key pages show each key's scopes and expiry."""

from __future__ import annotations

from django.test import Client

from runs.models import Tenant, User
from runs.services import api_key_issue


def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser(username="root", password="x"))
    return client


def test_the_key_list_and_page_show_its_scopes(tenant: Tenant) -> None:
    key, _ = api_key_issue(tenant=tenant, name="refund agent", scopes=["payments.refund"])
    client = admin_client()
    listing = client.get("/admin/runs/apikey/").content.decode()
    assert "payments.refund" in listing
    page = client.get(f"/admin/runs/apikey/{key.pk}/change/").content.decode()
    assert "payments.refund" in page
    assert "expires_at" in page
