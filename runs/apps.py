from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas and the projections of this app.
        from runs import event_types, projections  # noqa: F401
