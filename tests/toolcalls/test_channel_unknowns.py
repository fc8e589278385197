"""A chat channel hears of a call whose outcome is still unknown past its consistency window
while its look-ups fail (the gateway unreachable): once per call, through the outbox, to a
real local receiver — not for a call the look-up settles, not again at the next failure."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db.models import F

from runs.models import OutboxMessage, Tenant
from tests.helpers import REFUND, ApiClient, WebhookReceiver
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_until
from tests.toolcalls.test_channels import assert_never_an_action
from tests.toolcalls.test_desk import unknown_call
from toolcalls import reconcile
from toolcalls.connectors import SANDBOX_TOKENS
from toolcalls.models import ToolCall, Webhook, WebhookDelivery

STILL_UNKNOWN = "tool_call.still_unknown"


@pytest.fixture
def channel(tenant: Tenant, webhook_receiver: WebhookReceiver, settings) -> Webhook:
    settings.WEBHOOK_RETRY_BASE_SECONDS = 0.05
    settings.COUNTERSIGN_BASE_URL = "https://console.acme.example"
    return Webhook.objects.create(
        tenant=tenant,
        kind=Webhook.Kind.SLACK,
        url=webhook_receiver.url,
        event_types=list(Webhook.CHAT_EVENT_TYPES),
    )


@pytest.fixture
def gateway_down(tenant: Tenant, settings) -> Callable[[], None]:
    """Call it to make the payments system unreachable for this tenant: a port nothing
    listens on (a real refused connection, after the call was proposed and checked)."""
    return lambda: _unreachable(tenant, settings)


def _unreachable(tenant: Tenant, settings) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.COUNTERSIGN_CONNECTORS = {
        tenant.slug: {
            "payments": {
                "base_url": f"http://127.0.0.1:{port}",
                "token": SANDBOX_TOKENS["payments"],
            }
        }
    }


def past_the_window(call: ToolCall) -> None:
    """The answer was lost more than the refund's 2 s consistency window ago."""
    call.attempts.update(
        started_at=F("started_at") - timedelta(seconds=30),
        ended_at=F("ended_at") - timedelta(seconds=30),
    )


def look_up(call: ToolCall) -> ToolCall:
    reconcile.tool_call_reconcile(tool_call_id=call.pk)
    return ToolCall.objects.get(pk=call.pk)


def test_a_call_unknown_past_its_window_with_failing_look_ups_posts_once(
    agent: ApiClient,
    channel: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
    gateway_down: Callable[[], None],
    settings,
) -> None:
    call = unknown_call(agent, sandbox)
    gateway_down()
    past_the_window(call)
    assert look_up(call).execution_status == "result_unknown"
    delivery = WebhookDelivery.objects.get(event_type=STILL_UNKNOWN)
    # Written in the look-up's transaction, with its outbox message; sent by the outbox.
    assert OutboxMessage.objects.filter(task="toolcalls.deliver_webhook", args=[delivery.pk])
    run_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered")
    (message,) = webhook_receiver.events()
    assert message["text"].startswith("A call's outcome is still unknown: Refund $25.00")
    assert (
        f"<https://console.acme.example/desk/{call.pk}/|Open the desk item>"
        == (message["blocks"][2]["text"]["text"])
    )
    facts = json.dumps(message["blocks"][1])
    assert "look-up 1 failed: tool.lookup_unreachable" in facts and call.run_id in facts
    assert_never_an_action(message)

    # The next look-up fails too: nothing more posted for this call.
    assert look_up(call).execution_status == "result_unknown"
    assert WebhookDelivery.objects.filter(event_type=STILL_UNKNOWN).count() == 1

    # The gateway answers again: the look-up settles it, quietly.
    settings.COUNTERSIGN_CONNECTORS = {}
    assert look_up(call).execution_status == "completed"
    assert WebhookDelivery.objects.filter(event_type=STILL_UNKNOWN).count() == 1


def test_a_look_up_that_settles_the_call_or_fails_within_the_window_posts_nothing(
    agent: ApiClient,
    tenant: Tenant,
    channel: Webhook,
    sandbox: Sandbox,
    settings,
    gateway_down: Callable[[], None],
) -> None:
    early = unknown_call(agent, sandbox, intent="early")
    gateway_down()
    # Within the window a failed look-up is expected: the system may not show it yet.
    assert look_up(early).execution_status == "result_unknown"
    settings.COUNTERSIGN_CONNECTORS = {}
    found = unknown_call(agent, sandbox, args={**REFUND, "amount_cents": 100}, intent="found")
    past_the_window(found)
    assert look_up(found).execution_status == "completed"
    assert not WebhookDelivery.objects.filter(event_type=STILL_UNKNOWN).exists()


def test_a_channel_that_did_not_ask_for_it_hears_nothing(
    agent: ApiClient, channel: Webhook, sandbox: Sandbox, gateway_down: Callable[[], None]
) -> None:
    Webhook.objects.filter(pk=channel.pk).update(event_types=["desk.item_added"])
    call = unknown_call(agent, sandbox)
    gateway_down()
    past_the_window(call)
    assert look_up(call).execution_status == "result_unknown"
    assert not WebhookDelivery.objects.exists()
