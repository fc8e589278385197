"""The fixtures every test shares: tenants, people, the agent, a run, and the sandbox.
Helpers that are not fixtures (propose, decide, logged_in …) are in tests/helpers.py.
The suite runs on PostgreSQL and Redis (bin/test)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from runs import services as run_services
from runs.models import Run, Tenant, User
from runs.services import api_key_issue
from tests.celery_processes import CeleryProcess, flush_broker, process_env
from tests.helpers import ApiClient, WebhookReceiver, make_user, redis_shared
from tests.sandbox_process import Sandbox


def pytest_configure(config: pytest.Config) -> None:
    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine:
        raise pytest.UsageError(
            "The test suite runs against PostgreSQL and Redis: run it with bin/test, or set "
            "DATABASE_URL=postgres://... and CELERY_BROKER_URL=redis://... yourself."
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """schemathesis's item for each API operation gets the test function's nodeid, without the
    operation (tests/test_api_fuzz.py: 21 items, one nodeid; pytest 9 builds a function's id
    from `originalname` and a callspec, and schemathesis passes no callspec). pytest-xdist hands
    tests out by nodeid, so under bin/test one of them ran, and 20 fewer tests were reported
    than collected. Each gets the id pytest gives a node from its name (nodes.Node.__init__)."""
    for item in items:
        if item.parent is not None and not item.nodeid.endswith(item.name):
            item._id = item.parent.id.child(item.name)


@pytest.fixture(autouse=True)
def _redis_server_in_use() -> Iterator[None]:
    """No test runs while another one has the shared Redis server down (helpers.redis_down).
    Autouse, so it is set up before, and torn down after, the processes a test starts."""
    with redis_shared(settings.CELERY_BROKER_URL):
        yield


# --- tenants and people ---------------------------------------------------------------------


@pytest.fixture
def tenant(db: None) -> Tenant:
    return Tenant.objects.create(slug="acme", name="Acme Parts")


@pytest.fixture
def other_tenant(db: None) -> Tenant:
    return Tenant.objects.create(slug="globex", name="Globex")


@pytest.fixture
def owner(tenant: Tenant) -> User:
    """The person the agent acts for (an approver, who may not approve their own requests)."""
    return make_user("agent-owner", tenant, User.Role.APPROVER)


@pytest.fixture
def approver(tenant: Tenant) -> User:
    return make_user("alice", tenant, User.Role.APPROVER)


@pytest.fixture
def bob(tenant: Tenant) -> User:
    """A second approver."""
    return make_user("bob", tenant, User.Role.APPROVER)


@pytest.fixture
def admin_user(tenant: Tenant) -> User:
    return make_user("olivia", tenant, User.Role.ADMIN)


@pytest.fixture
def viewer(tenant: Tenant) -> User:
    return make_user("victor", tenant, User.Role.VIEWER)


# --- the agent and its runs -----------------------------------------------------------------


@pytest.fixture
def agent(owner: User, tenant: Tenant) -> ApiClient:
    """The agent, with the tenant's API key (`agent.key`), acting for `owner`; it may
    propose every capability (scope `*`)."""
    key, token = api_key_issue(tenant=tenant, name="agent", principal=owner, scopes=["*"])
    return ApiClient(token, key)


@pytest.fixture
def other_agent(other_tenant: Tenant) -> ApiClient:
    """Another tenant's agent."""
    return ApiClient(api_key_issue(tenant=other_tenant, name="other agent", scopes=["*"])[1])


@pytest.fixture
def run(tenant: Tenant) -> Run:
    """A run of the tenant, started through the service (for tests below the API)."""
    run, _ = run_services.run_start(tenant=tenant, title="refund", actor="test")
    return run


# --- the outside world ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def sandbox_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox")).start()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def sandbox(sandbox_process: Sandbox, settings: Any) -> Sandbox:
    """The simulated external systems, freshly seeded, with no faults, wired into settings.
    Calls to it time out after 1 s (its delay faults hold an answer for longer)."""
    if not sandbox_process.running:
        sandbox_process.start()  # a test stopped it, or it died
    sandbox_process.reset()
    settings.SANDBOX_URL = sandbox_process.url
    settings.TOOLCALL_TIMEOUT_OVERRIDE = 1.0
    return sandbox_process


@pytest.fixture
def start_celery(sandbox: Sandbox, tmp_path: Path) -> Iterator[Callable[..., CeleryProcess]]:
    """Start real Celery processes on the test database, Redis and the sandbox:
    `start_celery("worker", **environment)` (`queues="interactive"`: its -Q) or
    `start_celery("beat")`. They stop after the
    test; the broker is emptied before it."""
    flush_broker()
    started: list[CeleryProcess] = []

    def start(kind: str = "worker", queues: str = "", **env: str) -> CeleryProcess:
        name = f"{kind}{len(started)}"
        process = CeleryProcess(kind, name, process_env(sandbox.url, **env), tmp_path, queues)
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """A real HTTP receiver for webhooks on 127.0.0.1 (tests/helpers.py, WebhookReceiver)."""
    receiver = WebhookReceiver().start()
    yield receiver
    receiver.stop()
