from __future__ import annotations

from celery import shared_task

from runs import outbox


@shared_task(name="runs.sweep_outbox")
def sweep_outbox() -> int:
    return outbox.republish_due()
