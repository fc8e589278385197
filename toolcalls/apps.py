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

        register_drain_handlers()


def register_drain_handlers() -> None:
    """Ready calls are dispatched by the outbox drainer in batches (runs/drain.py): one wake-up
    per burst instead of one Celery message per call. Every process registers it, the web's
    too: its commits must know to wake a drainer. The approved-call task
    (`toolcalls.dispatch_approved`, the interactive queue) keeps a message of its own."""
    from runs import drain
    from toolcalls.writes import DISPATCH_TASK

    drain.register_batch(DISPATCH_TASK, dispatch_drained)


def dispatch_drained(items: list[tuple[list, str]]) -> None:
    """The drainer's handler of `toolcalls.dispatch` rows: the task's work, for a batch. Not in
    tasks.py, which a web process does not import."""
    from runs import logcontext
    from toolcalls.dispatch_batch import tool_calls_dispatch_batch

    if len(items) == 1:
        # As a task binds its arguments' ids: the statements before the call is loaded (the
        # outbox row's mark) name it in logs and spans too.
        logcontext.start(tool_call_id=items[0][0][0])
    tool_calls_dispatch_batch([(args[0], outbox_id) for args, outbox_id in items])
