"""The policy editor's "Add a rule": the form comes back as typed with one more empty row,
as many times as needed, and nothing is saved until the admin publishes."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from approvals.models import Policy
from runs.models import Tenant, User
from tests.helpers import logged_in
from tests.test_policies_console import edit_form

EDIT = "/policies/refund-order-v2/edit/"
OVER_300 = {"name": "medium", "field": "amount_cents", "value": "300", "approvers": 1}
OVER_700 = {"name": "large", "field": "amount_cents", "value": "700", "approvers": 2}
EUROS = {"name": "euros", "condition": 'currency == "EUR"', "approvers": 1, "risk": "medium"}


@pytest.fixture
def admin(admin_user: User) -> Client:
    return logged_in(admin_user)


def total_forms(page: str) -> int:
    return int(re.search(r'name="rules-TOTAL_FORMS" value="(\d+)"', page).group(1))


def test_it_adds_an_empty_row_and_keeps_what_was_typed(admin: Client) -> None:
    response = admin.post(EDIT, edit_form([OVER_300, OVER_700]) | {"add_rule": "1"})
    assert response.status_code == 200
    page = response.content.decode()
    assert total_forms(page) == 3
    assert 'name="rules-0-value" value="300"' in page and 'name="rules-1-value" value="700"' in page
    assert 'name="rules-1-name" value="large"' in page
    assert re.search(r'<input[^>]*name="rules-2-name"[^>]*autofocus', page)
    # The new row starts as an empty row of the editor does, so sent untouched it is skipped.
    assert re.search(r'name="rules-2-approvers" value="1"', page)
    assert re.search(r'<option value="high" selected>', page.split('name="rules-2-risk"')[1])
    assert 'name="expiry_hours" value="4"' in page
    assert not Policy.objects.exists()


def test_rows_added_one_visit_at_a_time_are_all_published(admin: Client, tenant: Tenant) -> None:
    again = admin.post(EDIT, edit_form([OVER_300, OVER_700, {}]) | {"add_rule": "1"})
    assert total_forms(again.content.decode()) == 4
    published = admin.post(EDIT, edit_form([OVER_300, OVER_700, EUROS, {}]))
    assert published.status_code == 302, published.content.decode()
    latest = Policy.objects.get(tenant=tenant, version=2)
    assert [rule["name"] for rule in latest.rules] == ["medium", "large", "euros"]


def test_a_row_typed_half_way_says_what_it_needs_and_nothing_is_saved(admin: Client) -> None:
    half = {"name": "half", "field": "amount_cents", "value": "lots"}
    page = admin.post(EDIT, edit_form([OVER_300, half]) | {"add_rule": "1"}).content.decode()
    assert total_forms(page) == 3
    assert "“lots” is not a number." in page
    assert not Policy.objects.exists()


def test_it_stops_at_the_most_rules_a_policy_has(admin: Client) -> None:
    rows = [{**OVER_300, "name": f"r{n}"} for n in range(20)]
    page = admin.post(EDIT, edit_form(rows) | {"add_rule": "1"}).content.decode()
    assert total_forms(page) == 20
    assert 'id="add-rule"' not in page and "A policy has at most 20 rules." in page


def test_a_form_without_its_row_count_starts_again(admin: Client) -> None:
    page = admin.post(EDIT, {"add_rule": "1"}).content.decode()
    assert total_forms(page) == 3  # the two default rules and an empty row
    assert not Policy.objects.exists()
