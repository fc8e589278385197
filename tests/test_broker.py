"""config/broker.py: a Redis broker's channel keeps one client object for its publishes (kombu's
made one per publish, a third of the approve POST's publish), and what is published is what
Celery's own transport published: the queue, the task, its arguments and how the worker logs
them (runs/outbox.py passes their repr, which Celery's saferepr made). Real Redis."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid

import pytest
import redis
from celery.utils.saferepr import saferepr
from django.conf import settings
from kombu.transport import redis as kombu_redis

from config import broker
from config.celery_app import app
from runs import outbox

pytestmark = pytest.mark.django_db


def test_a_redis_broker_is_served_by_the_transport_that_keeps_its_client() -> None:
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    with app.connection_for_write() as connection:
        assert isinstance(connection.default_channel, broker.Channel)


def test_publishes_share_one_client_and_reach_the_queue_as_celery_wrote_them(monkeypatch) -> None:
    made = []
    create = kombu_redis.Channel._create_client

    def counted(channel, asynchronous=False):
        made.append(asynchronous)
        return create(channel, asynchronous)

    monkeypatch.setattr(kombu_redis.Channel, "_create_client", counted)
    queue = f"test-broker-{uuid.uuid4().hex}"
    messages = [outbox.build("toolcalls.dispatch_approved", f"tc_{i}") for i in range(3)]
    for message in messages:
        assert outbox.publish(message, queue=queue)
    # The channel's kept client, made now or by an earlier publish (a new channel also makes
    # the asynchronous client of its poll, which kombu keeps).
    assert made.count(False) <= 1

    store = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        sent = [json.loads(raw) for raw in reversed(store.lrange(queue, 0, -1))]
    finally:
        store.delete(queue)
    assert len(sent) == len(messages)
    for message, envelope in zip(messages, sent, strict=True):
        headers = envelope["headers"]
        args, kwargs, _ = json.loads(base64.b64decode(envelope["body"]))
        assert (headers["task"], args, kwargs) == (
            "toolcalls.dispatch_approved",
            message.args,
            {"outbox_id": message.pk},
        )
        assert headers["argsrepr"] == saferepr(message.args)
        assert headers["kwargsrepr"] == saferepr({"outbox_id": message.pk})
        assert envelope["properties"]["delivery_info"]["routing_key"] == queue


@pytest.mark.parametrize(
    ("url", "transport"),
    [
        ("redis://127.0.0.1:6379/3", "config.broker:Transport"),
        # kombu turns TLS on for rediss:// only when the URL's scheme names the transport.
        ("rediss://127.0.0.1:6380/3", None),
        ("memory://localhost/", None),
    ],
)
def test_only_a_plain_redis_broker_is_given_the_transport(url: str, transport: str | None) -> None:
    env = {**os.environ, "CELERY_BROKER_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings.base"}
    named = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings;"
            " print(getattr(settings, 'CELERY_BROKER_TRANSPORT', None))",
        ],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    assert named == str(transport)
