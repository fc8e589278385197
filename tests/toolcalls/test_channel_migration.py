"""Chat channels made before `tool_call.still_unknown` existed: toolcalls.0010 adds it to
those that hear of desk items, and to no other."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from toolcalls.models import Webhook

BEFORE = [("toolcalls", "0009_console_page_indexes")]


@pytest.mark.django_db(transaction=True)
def test_old_chat_channels_with_desk_items_hear_of_still_unknown_calls() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        tenant = old.get_model("runs", "Tenant").objects.create(slug="acme", name="Acme")
        hooks = old.get_model("toolcalls", "Webhook").objects
        for pk, kind, types in [
            ("whk_desk", "slack", ["approval.requested", "desk.item_added"]),
            ("whk_approvals", "slack", ["approval.requested"]),
            ("whk_signed", "signed", ["tool_call.terminal"]),
        ]:
            hooks.create(
                id=pk, tenant=tenant, url="https://example.com/h", kind=kind, event_types=types
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    types = dict(Webhook.objects.values_list("id", "event_types"))
    assert types == {
        "whk_desk": ["approval.requested", "desk.item_added", "tool_call.still_unknown"],
        "whk_approvals": ["approval.requested"],
        "whk_signed": ["tool_call.terminal"],
    }
