from __future__ import annotations

from django.apps import AppConfig


class MemoryConfig(AppConfig):
    """What an agent needs to continue after a crash, on top of tool calls: checkpoints,
    the resume contract, feedback facts and the eval-trace projection."""

    name = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the event schemas and the projections of this app, and the archiving of
        # checkpoints at a run's end (runs/run_end.py).
        from memory import checkpoints, event_types, projections  # noqa: F401
        from memory.eval_trace import EVAL_READ_SCOPE
        from runs import scopes

        scopes.register_read_scope(EVAL_READ_SCOPE)
