from __future__ import annotations

from celery import shared_task

from runs import drain, outbox
from runs.faults import crashpoint


@shared_task(name="runs.sweep_outbox")
def sweep_outbox() -> int:
    drain.wake_if_due()
    return outbox.republish_due()


@shared_task(name=drain.WAKE_TASK)
def drain_outbox() -> int:
    handled = drain.outbox_drain()
    crashpoint("before_ack")
    return handled


@shared_task(name="runs.clear_expired_sessions")
def clear_expired_sessions() -> None:
    # Django deletes no expired session by itself (its `clearsessions` command is meant for
    # cron); beat runs this instead, so the session table holds live sessions only.
    from runs.sessions import SessionStore

    SessionStore.clear_expired()
