from __future__ import annotations

from django.test import Client

from approvals.models import Policy
from runs.admin_event_models import AdminEvent
from runs.models import Tenant, User


def admin_client() -> Client:
    root = User.objects.create_superuser(username="root", password="x")
    client = Client()
    client.force_login(root)
    return client


def form(tenant: Tenant, rules: str) -> dict:
    return {
        "tenant": tenant.pk,
        "capability_id": "refund-order-v2",
        "rules": rules,
        "expiry_seconds": 3600,
        "on_expiry": "cancel",
        "escalation_group": "",
        "escalate_before_seconds": 600,
    }


def test_editing_a_policy_writes_the_next_version(tenant: Tenant) -> None:
    first = Policy.objects.create(
        tenant=tenant, capability_id="refund-order-v2", version=1, rules=[]
    )
    rules = '[{"name": "all", "when": "amount_cents > 0", "approvers": 1}]'
    response = admin_client().post(
        f"/admin/approvals/policy/{first.pk}/change/", form(tenant, rules)
    )
    assert response.status_code == 302
    versions = list(Policy.objects.order_by("version").values_list("version", "rules"))
    assert versions == [(1, []), (2, [{"name": "all", "when": "amount_cents > 0", "approvers": 1}])]
    # Recorded as the console's edits are (approvals/policy_edits.py).
    event = AdminEvent.objects.get(event_type="policy.published")
    assert (event.actor, event.payload["version"], event.payload["from_version"]) == (
        "user:root",
        2,
        1,
    )


def test_a_policy_with_an_unsafe_condition_is_refused(tenant: Tenant) -> None:
    rules = '[{"name": "x", "when": "__import__(\'os\')", "approvers": 1}]'
    response = admin_client().post("/admin/approvals/policy/add/", form(tenant, rules))
    assert response.status_code == 200
    assert "not allowed" in response.content.decode()
    assert Policy.objects.count() == 0
