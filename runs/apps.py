from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas and the projections of this app, and the revocation
        # of run credentials at a run's end (runs/run_end.py).
        from runs import credentials, event_types, projections  # noqa: F401
