"""Policies in the console: sentences, versions and their diff, the editor (structured rows,
conditions refused by name with the issue's message, stale forms), and "try this rule" — which
answers exactly what POST /api/v1/policy/evaluate answers once the draft is published."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from approvals.models import Policy
from runs.admin_event_models import AdminEvent
from runs.models import Tenant, User
from tests.helpers import BIG_REFUND, ApiClient, approval_of, logged_in, make_user, propose
from tests.sandbox_process import Sandbox

REFUND = "refund-order-v2"
# The default rules compare amounts whatever the call's currency (escaped as the page has it).
ANY_CURRENCY = "(in the call&#x27;s currency)"


@pytest.fixture
def admin(admin_user: User) -> Client:
    return logged_in(admin_user)


def rule_row(index: int, **fields: Any) -> dict[str, Any]:
    row = {"name": "", "field": "", "operator": ">", "value": "", "condition": ""}
    row |= {"approvers": 1, "risk": "high"} | fields
    return {f"rules-{index}-{key}": value for key, value in row.items() if value is not None}


def edit_form(rows: list[dict[str, Any]], based_on: int = 1, **policy: Any) -> dict[str, Any]:
    data = {
        "based_on": based_on,
        "expiry_hours": 4,
        "expiry_minutes": 30,
        "on_expiry": "cancel",
        "escalation_group": "",
        "escalate_hours": 1,
        "escalate_minutes": 0,
        "rules-TOTAL_FORMS": len(rows),
        "rules-INITIAL_FORMS": 0,
        "rules-MIN_NUM_FORMS": 0,
        "rules-MAX_NUM_FORMS": 1000,
    } | policy
    for index, row in enumerate(rows):
        data |= rule_row(index, **row)
    return data


TWO_APPROVERS_OVER_500 = {"name": "big", "field": "amount_cents", "value": "500", "approvers": 2}


def test_the_list_says_each_rule_in_words(approver: User, tenant: Tenant) -> None:
    page = logged_in(approver).get("/policies/").content.decode()
    assert f"Refunds with amount over 200.00 {ANY_CURRENCY} need 1 approver" in page
    assert f"Refunds with amount over 1,000.00 {ANY_CURRENCY} need 2 different approvers" in page
    assert "expire after 24 h and then are cancelled" in page
    assert "(defaults, written at the first call)" in page


def test_viewers_do_not_read_and_approvers_do_not_edit(viewer: User, approver: User) -> None:
    assert logged_in(viewer).get("/policies/").status_code == 403
    assert logged_in(approver).get(f"/policies/{REFUND}/").status_code == 200
    assert logged_in(approver).get(f"/policies/{REFUND}/edit/").status_code == 403
    form = edit_form([TWO_APPROVERS_OVER_500])
    assert logged_in(approver).post(f"/policies/{REFUND}/edit/", form).status_code == 403
    assert logged_in(approver).post(f"/policies/{REFUND}/try/", form).status_code == 403
    assert not Policy.objects.exists()


def test_the_editor_shows_a_stored_rule_as_field_operator_and_dollars(admin: Client) -> None:
    page = admin.get(f"/policies/{REFUND}/edit/").content.decode()
    assert 'name="rules-0-value" value="200.00"' in page
    assert '<option value="amount_cants"' not in page and 'value="amount_cents" selected' in page


def test_publishing_writes_the_next_version_and_an_admin_event(
    admin: Client, agent: ApiClient, tenant: Tenant, sandbox: Sandbox
) -> None:
    before = approval_of(propose(agent, BIG_REFUND))  # asked under version 1
    response = admin.post(f"/policies/{REFUND}/edit/", edit_form([TWO_APPROVERS_OVER_500]))
    assert response.status_code == 302, response.content.decode()
    latest = Policy.objects.filter(tenant=tenant, capability_id=REFUND).order_by("-version")
    assert [p.version for p in latest] == [2, 1]
    assert latest[0].rules == [
        {"name": "big", "when": "amount_cents > 50000", "approvers": 2, "risk": "high"}
    ]
    assert (latest[0].expiry_seconds, latest[0].created_by) == (4 * 3600 + 1800, "user:olivia")
    event = AdminEvent.objects.get(event_type="policy.published")
    assert (event.actor, event.subject, event.payload["version"]) == (
        "user:olivia",
        f"policy:{REFUND}",
        2,
    )
    before.refresh_from_db()
    assert before.policy_version == 1  # an open approval keeps its version
    page = admin.get(f"/policies/{REFUND}/").content.decode()
    assert f"Refunds with amount over 500.00 {ANY_CURRENCY} need 2 different approvers" in page
    assert 'class="diff-removed"' in page and 'class="diff-added"' in page
    assert "expire after 4 h 30 min" in page
    assert f"{REFUND}: version 2 published" in admin.get("/people/").content.decode()


def test_the_same_policy_again_publishes_nothing(admin: Client, tenant: Tenant) -> None:
    admin.post(f"/policies/{REFUND}/edit/", edit_form([TWO_APPROVERS_OVER_500]))
    again = admin.post(f"/policies/{REFUND}/edit/", edit_form([TWO_APPROVERS_OVER_500], based_on=2))
    assert again.status_code == 302
    assert Policy.objects.filter(tenant=tenant).count() == 2
    assert AdminEvent.objects.count() == 1


def test_an_expression_is_refused_by_name_beside_its_field(admin: Client) -> None:
    form = edit_form([{"name": "double", "condition": "amount * 2"}])
    response = admin.post(f"/policies/{REFUND}/edit/", form)
    assert response.status_code == 422
    page = response.content.decode()
    assert "a condition can compare a field with a value; `amount * 2` is not allowed" in page
    assert 'id="id_rules-0-condition-error"' in page
    assert 'value="amount * 2"' in page  # what was typed stays
    assert not Policy.objects.exists()


def test_the_service_names_the_error(admin_user: User, tenant: Tenant) -> None:
    from approvals.policy_edits import PolicyDraft, policy_publish
    from runs.errors import DomainError

    draft = PolicyDraft(rules=[{"name": "x", "when": "amount * 2 > 1", "approvers": 1}])
    with pytest.raises(DomainError) as refused:
        policy_publish(tenant=tenant, capability_id=REFUND, draft=draft, based_on=1, by=admin_user)
    assert refused.value.name == "policy.condition_not_allowed"
    assert "`amount * 2` is not allowed" in refused.value.message


def test_a_value_that_is_not_a_number_is_refused_beside_it(admin: Client) -> None:
    form = edit_form([{"field": "amount_cents", "value": "lots"}])
    response = admin.post(f"/policies/{REFUND}/edit/", form)
    assert response.status_code == 422
    assert "“lots” is not a number." in response.content.decode()


def test_a_form_opened_before_another_admins_version_is_refused(
    admin: Client, tenant: Tenant
) -> None:
    other = make_user("oscar", tenant, User.Role.ADMIN)
    assert (
        logged_in(other)
        .post(f"/policies/{REFUND}/edit/", edit_form([TWO_APPROVERS_OVER_500]))
        .status_code
        == 302
    )
    response = admin.post(
        f"/policies/{REFUND}/edit/", edit_form([{"field": "amount_cents", "value": "1"}])
    )
    assert response.status_code == 409
    assert "Version 2 was published (user:oscar)" in response.content.decode()
    assert Policy.objects.filter(tenant=tenant).count() == 2


def test_trying_a_rule_saves_nothing_and_agrees_with_the_api_once_published(
    admin: Client, agent: ApiClient, tenant: Tenant
) -> None:
    args = {**BIG_REFUND, "amount_cents": 60000}
    form = edit_form([TWO_APPROVERS_OVER_500]) | {"try_args": __import__("json").dumps(args)}
    response = admin.post(f"/policies/{REFUND}/try/", form, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Needs 2 approvers</strong>, by rule “big”" in page
    assert "would expire after 4 h 30 min" in page
    assert "Now (version 1)" in page and "by rule “refunds over $200”" in page
    assert (
        f"“big”: Refunds with amount over 500.00 {ANY_CURRENCY} need 2 different approvers" in page
    )
    assert not Policy.objects.exists()
    admin.post(f"/policies/{REFUND}/edit/", form)
    api = agent.post("/api/v1/policy/evaluate", {"capability": REFUND, "args": args}).json()
    assert (api["rule"], api["required_approvers"], api["policy_version"]) == ("big", 2, 2)


def test_trying_against_a_recent_call_uses_its_arguments(
    admin: Client, agent: ApiClient, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)  # $250.00
    page = admin.get(f"/policies/{REFUND}/edit/").content.decode()
    assert call["tool_call_id"] in page
    form = edit_form([TWO_APPROVERS_OVER_500]) | {"try_call": call["tool_call_id"]}
    page = admin.post(f"/policies/{REFUND}/try/", form, HTTP_HX_REQUEST="true").content.decode()
    assert "Goes through without approval</strong>" in page  # $250 is under the new $500


def test_trying_with_bad_json_or_bad_rules_says_what_to_fix(admin: Client) -> None:
    form = edit_form([TWO_APPROVERS_OVER_500]) | {"try_args": "{nope"}
    page = admin.post(f"/policies/{REFUND}/try/", form, HTTP_HX_REQUEST="true").content.decode()
    assert "The example arguments are not JSON" in page
    form = edit_form([{"condition": "amount * 2"}]) | {"try_args": "{}"}
    page = admin.post(f"/policies/{REFUND}/try/", form).content.decode()
    assert "Fix the rules marked below first" in page and "is not allowed" in page


def test_another_tenants_call_cannot_be_tried(
    admin: Client, agent: ApiClient, other_tenant: Tenant, sandbox: Sandbox
) -> None:
    from toolcalls.models import ToolCall

    theirs = propose(agent, BIG_REFUND)["tool_call_id"]
    ToolCall.objects.filter(pk=theirs).update(tenant=other_tenant)  # as if globex had proposed it
    form = edit_form([TWO_APPROVERS_OVER_500]) | {"try_call": theirs}
    assert admin.post(f"/policies/{REFUND}/try/", form).status_code == 404


def queries_for(client: Client, path: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured)


def test_the_pages_ask_the_database_as_often_with_many_versions(
    admin: Client, tenant: Tenant
) -> None:
    def publish(versions: range) -> None:
        for version in versions:
            for capability in (REFUND, "reserve-stock-v1"):
                Policy.objects.create(
                    tenant=tenant, capability_id=capability, version=version, rules=[]
                )

    publish(range(1, 3))
    few = {path: queries_for(admin, path) for path in ("/policies/", f"/policies/{REFUND}/")}
    publish(range(3, 13))
    many = {path: queries_for(admin, path) for path in ("/policies/", f"/policies/{REFUND}/")}
    assert few == many
