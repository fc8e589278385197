"""runs/sql.py reads an API key as the ORM's select_related does: the same key, tenant and
person (none for a key without one), in one statement; the API still authenticates by it."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import sql
from runs.models import ApiKey, Tenant, User
from runs.services import api_key_issue
from tests.helpers import ApiClient

pytestmark = pytest.mark.django_db


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _orm(key: ApiKey) -> ApiKey:
    return ApiKey.objects.select_related("tenant", "principal").get(pk=key.pk)


def test_a_key_with_a_person_reads_as_the_orm_reads(tenant: Tenant, owner: User) -> None:
    key, _ = api_key_issue(tenant=tenant, name="k", principal=owner, scopes=["payments.*"])

    with CaptureQueriesContext(connection) as queries:
        read = sql.api_key_read(key.pk)
        slug, username = read.tenant.slug, read.principal.username  # no further query

    orm = _orm(key)
    assert len(queries) == 1
    assert _values(read) == _values(orm) and read.scopes == ["payments.*"]
    assert _values(read.tenant) == _values(orm.tenant)
    assert _values(read.principal) == _values(orm.principal)
    assert (slug, username) == (tenant.slug, owner.username)


def test_a_key_without_a_person_has_none(tenant: Tenant) -> None:
    key, _ = api_key_issue(tenant=tenant, name="k", scopes=[])

    with CaptureQueriesContext(connection) as queries:
        read = sql.api_key_read(key.pk)
        assert read.principal is None

    assert len(queries) == 1 and _values(read) == _values(_orm(key))


def test_no_key_reads_as_none(tenant: Tenant) -> None:
    assert sql.api_key_read("key_missing") is None


def test_the_api_authenticates_with_it(agent: ApiClient, tenant: Tenant) -> None:
    assert agent.get("/api/v1/capabilities").status_code == 200
    assert ApiClient(agent.token + "x").get("/api/v1/capabilities").status_code == 401
