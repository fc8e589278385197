from __future__ import annotations

from django.apps import AppConfig


class ToolcallsConfig(AppConfig):
    name = "toolcalls"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas and the projections of tool calls, and the contracts
        # (whose ids and permissions are what API key scopes may name, runs/scopes.py), and
        # the chat channels as listeners of escalations (approvals/notifications.py). The
        # lifecycle registers what a run's end closes (runs/run_end.py).
        from toolcalls import capabilities, channels, event_types, lifecycle, projections  # noqa: F401
