"""Keys issued before scopes existed keep working: migration runs.0005 gives them `*`."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from runs.models import ApiKey
from runs.selectors import hash_secret
from tests.helpers import ApiClient

BEFORE = [("runs", "0004_event_indexes")]


@pytest.mark.django_db(transaction=True)
def test_keys_from_before_scopes_get_every_capability() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        tenant = old.get_model("runs", "Tenant").objects.create(slug="acme", name="Acme")
        old.get_model("runs", "ApiKey").objects.create(
            id="key_old", tenant=tenant, name="old agent", secret_hash=hash_secret("s3cret")
        )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    key = ApiKey.objects.get(pk="key_old")
    assert key.scopes == ["*"]
    assert key.expires_at is None
    agent = ApiClient("key_old.s3cret", key)
    assert agent.post("/api/v1/runs", {"title": "t"}).status_code == 201
