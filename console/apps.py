from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The pages people use, on top of every other app: the approver's inbox and approval page,
    runs, the unknowns desk, audit, dashboard and metrics, and the demo. It owns no models."""

    name = "console"
