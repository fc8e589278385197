"""Shared people, tenants and API clients. The suite runs on PostgreSQL and Redis (bin/test)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from runs.models import ApiKey, Tenant, User
from runs.services import api_key_issue
from tests.sandbox_process import Sandbox

PASSWORD = "correct-horse-battery"


def pytest_configure(config: pytest.Config) -> None:
    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine:
        raise pytest.UsageError(
            "The test suite runs against PostgreSQL and Redis: run it with bin/test, or set "
            "DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://... yourself."
        )


class ApiClient:
    """The Django test client, speaking JSON with one tenant's API key."""

    def __init__(self, token: str) -> None:
        self.client = Client()
        self.token = token

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(headers or {})}

    def get(self, path: str, headers: dict[str, str] | None = None) -> Any:
        return self.client.get(path, headers=self._headers(headers))

    def post(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: str = ""
    ) -> Any:
        data = raw if raw else json.dumps(body if body is not None else {})
        return self.client.post(
            path, data=data, content_type="application/json", headers=self._headers(headers)
        )


@pytest.fixture
def tenant(db: None) -> Tenant:
    return Tenant.objects.create(slug="acme", name="Acme Parts")


@pytest.fixture
def other_tenant(db: None) -> Tenant:
    return Tenant.objects.create(slug="globex", name="Globex")


def make_user(username: str, tenant: Tenant, role: str) -> User:
    return User.objects.create_user(username=username, password=PASSWORD, tenant=tenant, role=role)


@pytest.fixture
def approver(tenant: Tenant) -> User:
    return make_user("alice", tenant, User.Role.APPROVER)


@pytest.fixture
def admin_user(tenant: Tenant) -> User:
    return make_user("olivia", tenant, User.Role.ADMIN)


@pytest.fixture
def viewer(tenant: Tenant) -> User:
    return make_user("victor", tenant, User.Role.VIEWER)


@pytest.fixture
def api_key(tenant: Tenant) -> tuple[ApiKey, str]:
    return api_key_issue(tenant=tenant, name="test agent")


@pytest.fixture
def api(api_key: tuple[ApiKey, str]) -> ApiClient:
    return ApiClient(api_key[1])


@pytest.fixture
def other_api(other_tenant: Tenant) -> ApiClient:
    return ApiClient(api_key_issue(tenant=other_tenant, name="other agent")[1])


@pytest.fixture(scope="session")
def sandbox_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox")).start()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(sandbox_process: Sandbox, settings: Any) -> Sandbox:
    """The simulated external systems, freshly seeded, with no faults, wired into settings."""
    if sandbox_process.process.poll() is not None:
        sandbox_process.start()  # a test restarted or killed it
    sandbox_process.reset()
    settings.SANDBOX_URL = sandbox_process.url
    return sandbox_process
