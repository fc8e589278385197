from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas (of runs and of administration) and the projections.
        from runs import admin_events, event_types, projections  # noqa: F401
