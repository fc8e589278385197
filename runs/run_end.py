"""What a run's end cleans up, whichever way it ends.

`run_transition` calls `run_ended` in the transaction of the transition that makes a run
terminal (completed, completed with degradation, failed permanently, cancelled). The base
layer revokes the run's credentials itself; the layers above register what they close (the
toolcalls app: calls not yet sent and their approvals; memory: checkpoints archived). Each
cleanup writes its own event, so every one is a recorded fact of the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable

from runs.models import Run

Cleanup = Callable[..., None]  # (*, run, actor, producer, reason) -> None

_CLEANUPS: list[Cleanup] = []


def register(cleanup: Cleanup) -> Cleanup:
    """Register `cleanup(*, run, actor, producer, reason)`, run at every terminal exit, in
    the order the apps register (INSTALLED_APPS: lower layers first)."""
    if cleanup not in _CLEANUPS:
        _CLEANUPS.append(cleanup)
    return cleanup


def run_ended(*, run: Run, actor: str, producer: str) -> None:
    reason = f"run {run.pk} ended: {run.state}"
    for cleanup in _CLEANUPS:
        cleanup(run=run, actor=actor, producer=producer, reason=reason)
