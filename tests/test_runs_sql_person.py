"""runs/sql.py reads the signed-in person as the ORM's select_related("tenant") does: the same
person and tenant (none for a person without one), in one statement; the console still signs
people in by it (runs/backends.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import sql
from runs.models import Tenant, User
from tests.helpers import logged_in

pytestmark = pytest.mark.django_db


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_a_person_reads_as_the_orm_reads(tenant: Tenant, approver: User) -> None:
    with CaptureQueriesContext(connection) as queries:
        read = sql.person_read(str(approver.pk))  # as the session stores it
        slug = read.tenant.slug  # no further query

    orm = User.objects.select_related("tenant").get(pk=approver.pk)
    assert len(queries) == 1
    assert _values(read) == _values(orm) and read.username == "alice"
    assert _values(read.tenant) == _values(orm.tenant) and slug == tenant.slug
    assert read.check_password("correct-horse-battery")


def test_a_person_without_a_tenant_has_none(db: None) -> None:
    staff = User.objects.create_user(username="root", password="x")
    with CaptureQueriesContext(connection) as queries:
        read = sql.person_read(staff.pk)
        assert read.tenant is None
    assert len(queries) == 1 and _values(read) == _values(User.objects.get(pk=staff.pk))


def test_no_person_reads_as_none(db: None) -> None:
    assert sql.person_read(999_999) is None


def test_the_console_signs_people_in_by_it(approver: User) -> None:
    client = logged_in(approver)
    assert client.get("/approvals/").status_code == 200
    approver.is_active = False
    approver.save()
    assert client.get("/approvals/").status_code == 302  # to the login page
