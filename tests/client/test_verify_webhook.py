"""countersign.verify_webhook on real deliveries: Countersign signs, the client checks."""

from __future__ import annotations

import json

import pytest
from countersign import WebhookVerificationError, verify_webhook

from runs.models import Tenant
from tests.helpers import BIG_REFUND, ApiClient, Received, WebhookReceiver, propose
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due
from toolcalls.models import Webhook


@pytest.fixture
def delivered(
    agent: ApiClient, tenant: Tenant, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> tuple[Received, str]:
    """One real delivery (a call cancelled: tool_call.terminal) and the webhook's secret."""
    webhook = Webhook.objects.create(
        tenant=tenant, url=webhook_receiver.url, event_types=["tool_call.terminal"]
    )
    call = propose(agent, BIG_REFUND)
    agent.post(f"/api/v1/tool-calls/{call['tool_call_id']}/cancel")
    run_due()
    (received,) = webhook_receiver.received
    return received, webhook.secret


def signed_at(received: Received) -> int:
    header = received.headers["Countersign-Signature"]
    return int(dict(part.split("=", 1) for part in header.split(","))["t"])


def test_it_accepts_a_genuine_delivery(delivered: tuple[Received, str]) -> None:
    received, secret = delivered
    event = verify_webhook(received.body, received.headers, secret)
    assert event["type"] == "tool_call.terminal"
    assert event["data"]["tool_call"]["status"] == "cancelled"
    # Header names in any case, the body as text.
    lower = {k.lower(): v for k, v in received.headers.items()}
    assert verify_webhook(received.body.decode(), lower, secret) == event


def test_it_refuses_an_old_timestamp(delivered: tuple[Received, str]) -> None:
    received, secret = delivered
    later = signed_at(received) + 301
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        verify_webhook(received.body, received.headers, secret, now=later)
    assert verify_webhook(received.body, received.headers, secret, tolerance=400, now=later)


def test_it_refuses_a_changed_body(delivered: tuple[Received, str]) -> None:
    received, secret = delivered
    event = json.loads(received.body)
    event["data"]["tool_call"]["status"] = "succeeded"
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook(json.dumps(event), received.headers, secret)


def test_it_refuses_another_secret(delivered: tuple[Received, str]) -> None:
    received, _ = delivered
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook(received.body, received.headers, "whsec_someone-else")


@pytest.mark.parametrize(
    "headers", [{}, {"Countersign-Signature": "v1=abc"}, {"Countersign-Signature": "t=x,v1=a"}]
)
def test_it_refuses_a_missing_or_malformed_signature(headers: dict[str, str]) -> None:
    with pytest.raises(WebhookVerificationError):
        verify_webhook(b"{}", headers, "whsec_secret")
