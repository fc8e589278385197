from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas (policy.published is with its write path) and the
        # projection of approvals.
        from approvals import event_types, policy_edits, projections  # noqa: F401
