"""Chat channels made before `tool_call.still_unknown` existed hear of it if they hear of desk
items: it is the early warning of the same thing (a call whose outcome nobody knows), and the
channel's admin could not have chosen it then. Channels without desk items keep their choice."""

from __future__ import annotations

from django.db import migrations

DESK = "desk.item_added"
STILL_UNKNOWN = "tool_call.still_unknown"


def add(apps: object, schema_editor: object) -> None:
    Webhook = apps.get_model("toolcalls", "Webhook")
    for hook in Webhook.objects.filter(kind="slack"):
        if DESK in hook.event_types and STILL_UNKNOWN not in hook.event_types:
            hook.event_types = [*hook.event_types, STILL_UNKNOWN]
            hook.save(update_fields=["event_types"])


class Migration(migrations.Migration):
    dependencies = [("toolcalls", "0009_console_page_indexes")]

    # Backwards leaves the lists as they are: a channel may have chosen it since.
    operations = [migrations.RunPython(add, migrations.RunPython.noop)]
