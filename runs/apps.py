from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas (of runs and of administration), the projections and the
        # `__any` lookup they read by (runs/lookups.py), and the revocation of run
        # credentials at a run's end (runs/run_end.py).
        from runs import admin_events, credentials, event_types, lookups, projections  # noqa: F401
