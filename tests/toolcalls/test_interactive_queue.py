"""A call a person approves is dispatched from the `interactive` queue, which workers take from
before the bulk queue: an approver's click does not wait behind auto-authorized work."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings

from runs.models import Event, OutboxMessage
from tests.celery_processes import flush_broker
from tests.helpers import BIG_REFUND, REFUND, approval_of, decide, logged_in, propose, wait_for
from toolcalls.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)  # the publish happens after the commit


def _queued(broker: redis.Redis, queue: str) -> list[tuple[str, list]]:
    """(task name, args) of the messages waiting in a Redis queue."""
    out = []
    for raw in broker.lrange(queue, 0, -1):
        message = json.loads(raw)
        out.append((message["headers"]["task"], message["headers"]["argsrepr"]))
    return out


def test_an_approved_calls_dispatch_goes_to_the_interactive_queue(agent, approver, sandbox):
    flush_broker()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    small = propose(agent, REFUND, intent="bulk")
    big = propose(agent, BIG_REFUND, intent="clicked")
    assert _queued(broker, "interactive") == []

    assert decide(logged_in(approver), approval_of(big), "approve").status_code == 302

    interactive = _queued(broker, "interactive")
    bulk = _queued(broker, "celery")
    assert [task for task, _ in interactive] == ["toolcalls.dispatch_approved"]
    assert big["tool_call_id"] in interactive[0][1]
    # The auto-authorized call's dispatch is left to the outbox drainer (runs/drain.py): the
    # bulk queue holds one wake-up for it (beside the approver's notification), and no
    # dispatch message of either call.
    bulk_tasks = [task for task, _ in bulk]
    assert bulk_tasks.count("runs.drain_outbox") == 1
    assert not [task for task in bulk_tasks if task.startswith("toolcalls.dispatch")]
    assert OutboxMessage.objects.get(task="toolcalls.dispatch").args == [small["tool_call_id"]]


@pytest.mark.slow
def test_a_worker_takes_the_approved_call_before_the_bulk_backlog(
    agent, approver, sandbox, start_celery
):
    flush_broker()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    big = propose(agent, BIG_REFUND, intent="clicked")
    # A backlog of bulk work, committed before the approval: the drainer's wake-up in `celery`.
    for n in range(20):
        propose(agent, {"order_id": "order-002"}, capability="get-order-v1", intent=f"bulk-{n}")
    assert decide(logged_in(approver), approval_of(big), "approve").status_code == 302
    assert broker.llen("celery") >= 1 and broker.llen("interactive") == 1

    # One worker taking one message at a time: it starts with the approved call.
    start_celery("worker")  # --concurrency 1
    wait_for(
        lambda: ToolCall.objects.filter(execution_status="completed").count() >= 2,
        60,
        "the worker to dispatch two calls",
    )
    first = (
        Event.objects.filter(event_type="tool_call.dispatching")
        .order_by("occurred_at", "seq")
        .first()
    )
    assert first.tool_call_id == big["tool_call_id"]


@pytest.mark.slow
def test_a_worker_of_the_interactive_queue_alone_takes_the_approved_call_and_no_bulk_work(
    agent, approver, sandbox, start_celery
):
    """The Procfile's `interactive` worker (-Q interactive): free for clicks however busy the
    bulk workers are, because it never takes their work."""
    flush_broker()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    big = propose(agent, BIG_REFUND, intent="clicked")
    bulk = [
        propose(agent, {"order_id": "order-002"}, capability="get-order-v1", intent=f"bulk-{n}")
        for n in range(5)
    ]
    assert decide(logged_in(approver), approval_of(big), "approve").status_code == 302

    start_celery("worker", queues="interactive")
    wait_for(
        lambda: ToolCall.objects.get(pk=big["tool_call_id"]).execution_status == "completed",
        60,
        "the interactive worker to dispatch the approved call",
    )
    # The bulk calls' dispatch waits in `celery`: one coalesced drain wake-up for all five.
    assert broker.llen("celery") >= 1
    assert not Event.objects.filter(
        event_type="tool_call.dispatching", tool_call_id__in=[c["tool_call_id"] for c in bulk]
    ).exists()
